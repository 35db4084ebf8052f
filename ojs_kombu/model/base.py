"""The machinery of the envelope's models: strict and tolerant reading, known keys, ``to_dict``.

A model is read in one of two modes, passed as pydantic validation context
(:func:`mode_context`): *strict* applies the JSON schema's rules (unknown keys
refused unless the model allows them, ``null`` refused for optional fields);
*tolerant* is the consumer path of DESIGN §2 (``null`` counts as absent, unknown
keys are kept).  Plain Python construction (no context) behaves like strict,
except that ``None`` means "absent".  Every failure is our
:class:`~ojs_kombu.errors.ValidationError`, never pydantic's.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator
from pydantic import ValidationError as _PydanticValidationError
from pydantic_core import PydanticUndefined

from ojs_kombu.model._problems import Problem
from ojs_kombu.model._problems import convert_pydantic_error as _convert

# Context key of the validation mode, and its two values.
_MODE = "ojs_mode"
_STRICT = "strict"
_TOLERANT = "tolerant"


def mode_context(*, strict: bool) -> dict[str, str]:
    """The pydantic validation context that reads a model strictly or tolerantly."""
    return {_MODE: _STRICT if strict else _TOLERANT}


def is_tolerant(info: ValidationInfo) -> bool:
    """Whether the validation in progress is tolerant (the consumer path)."""
    context = info.context
    return isinstance(context, dict) and context.get(_MODE) == _TOLERANT


M = TypeVar("M", bound=BaseModel)

_KNOWN_KEYS: dict[type, dict[str, str]] = {}  # per model: JSON key -> attribute name
_RENAMED: dict[type, dict[str, str]] = {}  # per model: attribute name -> JSON key, where they differ


class OjsModel(BaseModel):
    """Shared behaviour: our ValidationError only, modes, ``to_dict`` of set fields."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    _label: ClassVar[str] = "object"
    _allows_unknown: ClassVar[bool] = False  # unknown keys outside tolerant mode
    _nullable: ClassVar[frozenset[str]] = frozenset()  # known keys that may be JSON null in strict mode

    def __init__(self, /, **data: Any) -> None:
        """Validate ``data`` (Python values; ``None`` means absent); raise ``ValidationError``."""
        try:
            super().__init__(**data)
        except _PydanticValidationError as exc:
            raise _convert(exc) from None

    # Without this mark pydantic-core would call this __init__ for nested models too,
    # dropping the validation context (strict/tolerant mode).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        """Assign with validation; a bad value raises ``ValidationError``."""
        if self.__pydantic_fields_set__.__class__ is SharedFieldsSet:
            _set_fields_set(self, set(self.__pydantic_fields_set__))  # pydantic adds `name` to it in place
        try:
            super().__setattr__(name, value)
        except _PydanticValidationError as exc:
            raise _convert(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        """pydantic's ``model_validate``, raising :class:`ValidationError` instead of pydantic's."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except _PydanticValidationError as exc:
            raise _convert(exc) from None

    @classmethod
    def _known(cls) -> dict[str, str]:
        """JSON key -> attribute name, in declaration order."""
        known = _KNOWN_KEYS.get(cls)
        if known is None:
            known = _KNOWN_KEYS[cls] = {(f.alias or name): name for name, f in cls.model_fields.items()}
            _RENAMED[cls] = {name: key for key, name in known.items() if key != name}
        return known

    @model_validator(mode="before")
    @classmethod
    def _apply_mode(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        mode = info.context.get(_MODE) if isinstance(info.context, dict) else None
        known = cls._known()
        if mode == _TOLERANT:
            # ojs-json-format: null counts as absent.  Unknown keys are kept verbatim.
            return {k: v for k, v in data.items() if v is not None or k not in known}
        if not cls._allows_unknown:
            for key in data:
                if key not in known:
                    raise Problem(f"unknown field of the {cls._label} (allowed: {', '.join(known)})", str(key))
        if mode == _STRICT:
            for key, value in data.items():
                if value is None and key in known and key not in cls._nullable:
                    hint = "" if cls.model_fields[known[key]].is_required() else " (omit the field instead)"
                    raise Problem(f"must not be null{hint}", key)
        return data

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready dict: set fields that are not None, then unknown fields.

        Nested policies become dicts; other nested values (``args``, ``meta``...) are
        shared with the model, not copied.
        """
        out: dict[str, Any] = {}
        fields_set = self.__pydantic_fields_set__
        renamed = _RENAMED.get(type(self))
        if renamed is None:
            type(self)._known()
            renamed = _RENAMED[type(self)]
        for name, value in self.__dict__.items():  # declaration order
            if value is not None and name in fields_set:
                # isinstance on a pydantic model class is slow (its metaclass is an ABCMeta):
                # the plain JSON types are ruled out first, by exact type (Job.to_dict runs per publish).
                if type(value) not in _PLAIN_TYPES and isinstance(value, OjsModel):
                    value = value.to_dict()
                out[renamed[name] if name in renamed else name] = value
        if self.__pydantic_extra__:
            out.update(self.__pydantic_extra__)
        return out


# Exact types of values that to_dict passes on as they are, without asking isinstance.
_PLAIN_TYPES = frozenset({str, int, float, bool, list, dict})


# pydantic's BaseModel keeps an instance's state in four slots.  Models built without validation
# (a tolerant read builds a Job and copies a retry policy per delivery) write them through the
# slots' own descriptors: object.__setattr__ would look each name up through the model's classes
# first (measured: ~1,200 instructions more per slot).  A pydantic without these slots fails here,
# at import, not later.
_set_state_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_new_object = object.__new__  # BaseModel defines no __new__


class SharedFieldsSet(set[str]):
    """A fields set that many models hold at once (``Job.create`` gives every plain job the same one).

    A tracked container less per model: on a producer's loop of ``Job.create`` calls, the cyclic
    collector's passes over the jobs cost about as much as creating them.  :class:`OjsModel`
    replaces it by a plain copy before an assignment adds to it; mutating it directly raises
    ``TypeError``; copying or pickling it gives a plain ``set``.
    """

    def _shared(self, *args: Any) -> Any:
        raise TypeError("this fields set is shared by several models; assign the field, or copy the set")

    add = discard = remove = pop = clear = update = _shared
    difference_update = intersection_update = symmetric_difference_update = _shared
    __ior__ = __iand__ = __isub__ = __ixor__ = _shared

    def __copy__(self) -> set[str]:
        return set(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> set[str]:
        return set(self)

    def __reduce__(self) -> tuple[type[set[str]], tuple[list[str]]]:
        return set, (list(self),)


def construct_trusted(
    cls: type[M],
    values: dict[str, Any],
    fields_set: set[str],
    extra: dict[str, Any] | None = None,
    private: dict[str, Any] | None = None,
) -> M:
    """A model of ``cls`` holding ``values`` as they are: what ``model_construct`` builds, without
    its per-field loop or any validation.

    Parameters:
        cls: the model class.
        values: every field's value, in declaration order (the model's ``__dict__``; not copied).
        fields_set: the fields given explicitly.
        extra: the unknown fields (``extra="allow"`` models).
        private: the private attributes.

    Returns:
        The model.
    """
    model: M = _new_object(cls)
    _set_state_dict(model, values)
    _set_fields_set(model, fields_set)
    _set_extra(model, extra)
    _set_private(model, private)
    return model


def shallow_copy(model: M) -> M:
    """``model.model_copy()``: a new model with its own field dict, fields set and extras (values shared).

    Built as pydantic's ``__copy__`` builds it, with the containers' own ``copy`` instead of
    ``copy.copy`` (a tolerant read copies a remembered retry policy per job).

    Parameters:
        model: the model to copy.

    Returns:
        The copy.
    """
    extra = model.__pydantic_extra__
    private = model.__pydantic_private__
    return construct_trusted(
        type(model),
        model.__dict__.copy(),
        model.__pydantic_fields_set__.copy(),
        None if extra is None else extra.copy(),
        None if private is None else {k: v for k, v in private.items() if v is not PydanticUndefined},
    )


__all__ = ["OjsModel", "SharedFieldsSet", "construct_trusted", "is_tolerant", "mode_context", "shallow_copy"]
