"""Validation problems with a path, and their conversion to :class:`ValidationError` (internal).

The envelope's checks (``envelope``, ``timefmt``, ``jsonvalue``) raise :class:`Problem`
at the spot they find it; callers prefix the path as the problem travels up
(``args`` -> ``[2]`` -> ``when``), and :func:`public_error` / :func:`convert_pydantic_error`
turn it into the public error whose ``field`` is ``"args[2].when"``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError as _PydanticValidationError

from ojs_kombu.errors import ValidationError


class Problem(ValueError):
    """A problem at ``path``, relative to the value being checked (internal).

    Validators raise it so pydantic keeps the location; :func:`convert_pydantic_error` joins
    that location with ``path`` into the public ``ValidationError.field``.
    """

    def __init__(self, text: str, path: str = ""):
        super().__init__(text)
        self.text = text
        self.path = path

    def under(self, segment: str) -> Problem:
        """Prefix the path with ``segment`` (a key or ``[index]``) and return self."""
        self.path = join_path(segment, self.path)
        return self


def join_path(base: str, rel: str) -> str:
    """``base`` and ``rel`` as one path: ``args`` + ``[2]`` -> ``args[2]``, ``args[2]`` + ``when`` -> ``args[2].when``."""
    if not rel:
        return base
    if not base:
        return rel
    return base + rel if rel[0] == "[" else f"{base}.{rel}"


def public_error(problem: Problem, field: str | None) -> ValidationError:
    """``problem`` found in the value named ``field``, as the public :class:`ValidationError`."""
    path = join_path(field or "", problem.path) or None
    message = f"{path}: {problem.text}" if path else problem.text
    return ValidationError(message, field=path)


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def convert_pydantic_error(exc: _PydanticValidationError, prefix: str = "") -> ValidationError:
    """Turn a pydantic error into ours: one entry per problem, ``field`` = first path."""
    errors: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False):
        path = prefix
        for part in err["loc"]:
            path = join_path(path, f"[{part}]" if isinstance(part, int) else str(part))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, Problem):
            path, text = join_path(path, cause.path), cause.text
        elif isinstance(cause, ValidationError):
            text = str(cause)
        elif err["type"] == "missing":
            text = "is required"
        else:
            text = f"{err['msg']} (got {short_repr(err.get('input'))})"
        errors.append({"field": path or None, "message": f"{path}: {text}" if path else text})
    if len(errors) == 1:
        message = errors[0]["message"]
    else:
        message = f"{len(errors)} problems: " + "; ".join(e["message"] for e in errors)
    return ValidationError(message, field=errors[0]["field"] if errors else None, errors=errors)


__all__ = ["Problem", "convert_pydantic_error", "join_path", "public_error", "short_repr"]
