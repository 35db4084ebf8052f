"""The ``ojs-amqp`` command line against a real broker."""

from __future__ import annotations

import json

import pytest
from support import get_messages, message_count, raw_channel

from ojs_kombu import Job
from ojs_kombu.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_enqueue_declare_and_dead_letter_commands(capsys, amqp_url, prefix, names):
    common = ["--url", amqp_url, "--prefix", prefix]
    code, out, _ = run(capsys, "declare", "email", *common, "--max-priority", "10")
    assert code == 0 and out.strip() == names.job_queue("email")

    code, out, _ = run(
        capsys,
        "enqueue",
        "email.send",
        '["ada@example.com"]',
        "--queue",
        "email",
        "--kwargs",
        '{"lang": "fr"}',
        "--priority",
        "5",
        *common,
    )
    job = Job.from_json(out)
    assert code == 0 and job.kwargs == {"lang": "fr"} and job.priority == 5
    [(_, properties, _)] = get_messages(amqp_url, names.job_queue("email"), 1, ack=False)
    assert properties.message_id == job.id

    with raw_channel(amqp_url) as channel:  # dead-letter it the way a worker would
        method, _, _ = channel.basic_get(names.job_queue("email"))
        channel.basic_nack(method.delivery_tag, requeue=False)

    code, out, _ = run(capsys, "dlq", "list", "email", *common)
    [entry] = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and entry["id"] == job.id and entry["reason"] == "rejected"
    assert message_count(amqp_url, names.dead_letter_queue("email")) == 1  # listing kept it

    code, out, _ = run(capsys, "dlq", "replay", "email", *common)
    assert json.loads(out) == {"replayed": [job.id]}
    assert message_count(amqp_url, names.job_queue("email")) == 1

    run(capsys, "enqueue", "x.y", "[]", "--queue", "email", *common)
    with raw_channel(amqp_url) as channel:
        for _ in range(2):
            method, _, _ = channel.basic_get(names.job_queue("email"))
            channel.basic_nack(method.delivery_tag, requeue=False)
    with pytest.raises(SystemExit, match="--yes"):  # refuses without --yes
        main(["dlq", "purge", "email", *common])
    assert message_count(amqp_url, names.dead_letter_queue("email")) == 2
    code, out, _ = run(capsys, "dlq", "purge", "email", "--yes", *common)
    assert json.loads(out) == {"purged": 2}


def test_bad_input_is_a_clear_error(capsys, amqp_url, prefix):
    code, _, err = run(capsys, "enqueue", "Bad Type", "[]", "--url", amqp_url, "--prefix", prefix)
    assert code == 1 and "ValidationError" in err and "guest" not in err
