"""Workflows (ojs-workflows.md): chain, group and batch definitions, their states, results and wire form.

Pure: no I/O.  The broker side (fan-in counting, exactly-once callbacks) is
:mod:`ojs_kombu.amqp.fanin`; enqueueing and advancing a workflow are the client's and the worker's.

* **Definitions**: :func:`chain`, :func:`group`, :func:`batch` build frozen :class:`Chain`,
  :class:`Group` and :class:`Batch` objects whose members are :class:`~ojs_kombu.model.job.Job`\\ s,
  job specs (the spec's ``{"type", "args", "options"}``) or nested workflows.  Checked when built
  (§11.1): at least one step or job, a batch has at least one callback, callbacks are jobs, nesting
  follows §10.1 and is at most :data:`MAX_NESTING_DEPTH` workflow levels deep (§10.2).
  :func:`workflow_to_dict` / :func:`workflow_from_dict` are the spec's JSON form.
* **Addresses**: every job of a workflow has a *path* from the root: the index of each step or
  job on the way (``(1, 2)``: job 2 of the group that is step 1), a callback ends with its name
  (``(1, "on_failure")``).  On the wire a path is a JSON array.
* **State machine**: :func:`evaluate` takes the outcomes recorded so far (path →
  :class:`Outcome`) and returns the :class:`Status`: the workflow's state (§8), every job's step
  state (§4.4), and the jobs to enqueue now (:class:`Runnable`, each with its
  ``parent_results``, §7).  Failure propagation is §9: a chain stops at a failed step and cancels
  the steps after it; a group waits for every job and then fails; a batch fires its callbacks
  (``on_complete`` always, ``on_success`` with no failure, ``on_failure`` with one) and fails only
  when a callback fails.
* **Results** (§7.5): a job's result carried by a workflow is at most :data:`MAX_RESULT_BYTES`;
  the results carried inline in one envelope at most :data:`MAX_INLINE_RESULTS_BYTES`.
* **Wire form**: :class:`WorkflowContext`, under ``meta.workflow`` of each job of a workflow.

Modules, bottom up: ``definitions`` (the frozen objects, paths, depth), ``build`` (the checked
builders and the spec's JSON form), ``state`` (the state machine), ``results`` (result sizes) and
``context`` (the wire form).  Every public name is importable from this package.
"""

from ojs_kombu.model.workflow.build import MemberLike, batch, chain, group, workflow_from_dict, workflow_to_dict
from ojs_kombu.model.workflow.context import WORKFLOW_META_KEY, FanInRef, WorkflowContext
from ojs_kombu.model.workflow.definitions import (
    CALLBACK_NAMES,
    MAX_NESTING_DEPTH,
    Batch,
    CallbackName,
    Chain,
    Group,
    Node,
    Path,
    Workflow,
    WorkflowType,
    check_depth,
    depth,
    job_count,
    node_at,
)
from ojs_kombu.model.workflow.results import (
    MAX_INLINE_RESULTS_BYTES,
    MAX_RESULT_BYTES,
    check_result,
    fit_parent_results,
    result_size,
)
from ojs_kombu.model.workflow.state import (
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    Outcome,
    Runnable,
    Status,
    StepState,
    WorkflowState,
    check_step_transition,
    check_transition,
    evaluate,
)

__all__ = [
    "CALLBACK_NAMES",
    "MAX_INLINE_RESULTS_BYTES",
    "MAX_NESTING_DEPTH",
    "MAX_RESULT_BYTES",
    "STEP_TRANSITIONS",
    "WORKFLOW_META_KEY",
    "WORKFLOW_TRANSITIONS",
    "Batch",
    "CallbackName",
    "Chain",
    "FanInRef",
    "Group",
    "MemberLike",
    "Node",
    "Outcome",
    "Path",
    "Runnable",
    "Status",
    "StepState",
    "Workflow",
    "WorkflowContext",
    "WorkflowState",
    "WorkflowType",
    "batch",
    "chain",
    "check_depth",
    "check_result",
    "check_step_transition",
    "check_transition",
    "depth",
    "evaluate",
    "fit_parent_results",
    "group",
    "job_count",
    "node_at",
    "result_size",
    "workflow_from_dict",
    "workflow_to_dict",
]
