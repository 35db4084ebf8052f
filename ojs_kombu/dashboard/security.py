"""The dashboard's guards: the bearer token, the CSRF double-submit cookie and read-only mode.

* ``--auth-token``: every request needs ``Authorization: Bearer <token>`` or the
  ``ojs_token`` cookie; ``?token=<token>`` on any GET sets that cookie (HttpOnly,
  SameSite=Strict) and redirects to the same URL without it.  Otherwise 401.
* ``--read-only``: every POST is refused with 403 (the pages show no action).
* CSRF: every response sets an ``ojs_csrf`` cookie when the request had none; every POST
  must carry the same value in its ``csrf`` form field (:func:`posted_form`; 403 otherwise).
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

TOKEN_COOKIE = "ojs_token"
CSRF_COOKIE = "ojs_csrf"
CSRF_FIELD = "csrf"


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def csrf_token(request: Request) -> str:
    """The CSRF token of this browser: its cookie, else the one the middleware is about to set."""
    return request.cookies.get(CSRF_COOKIE) or str(request.state.new_csrf)


class CsrfError(Exception):
    """A POST without the CSRF token of its cookie (answered 403)."""


async def posted_form(request: Request) -> FormData:
    """The form of a POST, once its ``csrf`` field matches the ``ojs_csrf`` cookie.

    (Checked by each action rather than by :class:`Guard`: a middleware that reads the body
    leaves the endpoint an empty form.)

    Parameters:
        request: the POST.

    Returns:
        Its form fields.

    Raises:
        CsrfError: no cookie, no field, or they differ.
    """
    form = await request.form()
    field, cookie = form.get(CSRF_FIELD), request.cookies.get(CSRF_COOKIE)
    if cookie is None or not isinstance(field, str) or not _same(field, cookie):
        raise CsrfError("bad or missing CSRF token")
    return form


class Guard(BaseHTTPMiddleware):
    """Checks the token and read-only mode of every request, and sets the CSRF cookie (see the module docstring).

    Parameters:
        app: the application guarded.
        token: the required token, or None (no authentication).
        read_only: refuse every POST.
    """

    def __init__(self, app: ASGIApp, *, token: str | None, read_only: bool) -> None:
        super().__init__(app)
        self._token = token
        self._read_only = read_only

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Answer 401 / 403 or a token redirect, else the page (with the CSRF cookie set)."""
        if self._token is not None:
            given = request.query_params.get("token")
            if given is not None and request.method == "GET":
                if not _same(given, self._token):
                    return PlainTextResponse("unauthorized", status_code=401)
                rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
                redirect = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
                redirect.set_cookie(TOKEN_COOKIE, self._token, httponly=True, samesite="strict")
                return redirect
            header = request.headers.get("authorization", "")
            bearer = header[7:] if header.lower().startswith("bearer ") else None
            if not (_same(bearer, self._token) or _same(request.cookies.get(TOKEN_COOKIE), self._token)):
                return PlainTextResponse("unauthorized", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if request.method not in ("GET", "HEAD"):
            if self._read_only:
                return PlainTextResponse("read-only dashboard", status_code=403)
        request.state.new_csrf = secrets.token_urlsafe(32)
        response = await call_next(request)
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(CSRF_COOKIE, request.state.new_csrf, httponly=True, samesite="strict")
        return response
