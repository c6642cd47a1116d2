"""Who may talk to the chat server: its Host, the page's Origin and a token.

A page on another site can send the server requests (a ``text/plain`` POST
needs no CORS preflight) and a DNS name that an attacker points at
127.0.0.1 reaches a loopback server with a foreign ``Host`` (DNS
rebinding). :class:`Access` refuses both, as Jupyter's server does:

* ``Host`` must name the address the connection came in on (the ASGI
  ``server`` of the request, ``[v6]`` in brackets), ``localhost``,
  ``127.0.0.1`` or ``[::1]``, or one of the names the user allowed
  (``--allow_host``), with the served port (``:80`` may be left out).
* ``Origin``, when a browser sends one, must be the page's own
  (``http://`` and the ``Host`` just checked) or one the user allowed
  (``--allow_origin``); ``Origin: null`` is refused.
* A token, when set (always for a bind to a non-loopback address), must come
  with the request: ``?token=`` in the URL, ``Authorization: Bearer TOKEN``
  (or ``token TOKEN``), or the cookie the page's first visit with
  ``?token=`` sets.

A refused request gets a 403 ``{"error": ONE LINE}`` and never reaches the app.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
from urllib.parse import parse_qs

from fastapi.responses import JSONResponse

COOKIE = "laplax_chat_token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
  """Whether ``host`` (a name or an address) is this machine's loopback."""
  if host.lower() == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False


def new_token() -> str:
  """A random URL-safe token (32 characters, 192 bits)."""
  return secrets.token_urlsafe(24)


def _headers(scope) -> dict[str, str]:
  out: dict[str, str] = {}
  for k, v in scope.get("headers", ()):
    out.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
  return out


def _cookie(header: str) -> str | None:
  for part in header.split(";"):
    name, _, value = part.strip().partition("=")
    if name == COOKIE:
      return value
  return None


@dataclasses.dataclass(frozen=True)
class Access:
  """The server's rules (see the module docstring).

  ``hosts``: extra names allowed in ``Host`` (lower case, without port);
  ``origins``: extra origins allowed (``scheme://host[:port]``); ``token``:
  the token every request must carry, or ``None``.
  """

  hosts: tuple[str, ...] = ()
  origins: tuple[str, ...] = ()
  token: str | None = None

  def _host_refusal(self, host: str | None, server) -> str | None:
    if not host:
      return "the request has no Host header"
    addr, port = (server or ("", 0))[:2]
    addr = f"[{addr}]" if ":" in str(addr) else str(addr)
    names = {*LOOPBACK_NAMES, addr.lower(), *(h.lower() for h in self.hosts)}
    allowed = {f"{n}:{port}" for n in names} | (names if port == 80 else set())
    if host.lower() not in allowed:
      shown = host if len(host) <= 80 else host[:80] + "..."
      return (
        f"Host {shown!r} is not this server's (it serves port {port} as localhost, "
        "127.0.0.1, [::1] or its address); add a name with --allow_host"
      )
    return None

  def _origin_refusal(self, origin: str | None, host: str) -> str | None:
    if origin is None:
      return None
    own = f"http://{host}".lower()
    if origin.lower().rstrip("/") in {own, *(o.lower().rstrip("/") for o in self.origins)}:
      return None
    shown = origin if len(origin) <= 80 else origin[:80] + "..."
    return (
      f"Origin {shown!r} is not this server's page; a page of another site cannot use "
      "it (allow one with --allow_origin)"
    )

  def _token_refusal(self, scope, headers: dict[str, str]) -> str | None:
    if self.token is None:
      return None
    given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [None])[0]
    auth = headers.get("authorization", "").split(None, 1)
    if given is None and len(auth) == 2 and auth[0].lower() in ("bearer", "token"):
      given = auth[1].strip()
    if given is None:
      given = _cookie(headers.get("cookie", ""))
    if given is not None and secrets.compare_digest(given.encode(), self.token.encode()):
      return None
    what = "a wrong token" if given else "no token"
    return (
      f"{what}: open the URL the server printed at start (with ?token=), or send "
      "'Authorization: Bearer TOKEN'"
    )

  def refusal(self, scope) -> str | None:
    """Why the ASGI HTTP request ``scope`` is refused (one line), or ``None``."""
    headers = _headers(scope)
    host = headers.get("host")
    return (
      self._host_refusal(host, scope.get("server"))
      or self._origin_refusal(headers.get("origin"), host or "")
      or self._token_refusal(scope, headers)
    )


class Guard:
  """ASGI middleware: :meth:`Access.refusal` of every HTTP request, a 403
  ``{"error": LINE}`` when refused; a page opened with the right
  ``?token=`` gets the token as a cookie (``HttpOnly``, ``SameSite=Strict``)."""

  def __init__(self, app, access: Access):
    self.app, self.access = app, access

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    refused = self.access.refusal(scope)
    if refused:
      return await JSONResponse({"error": refused}, status_code=403)(scope, receive, send)
    if self.access.token is None or b"token=" not in scope.get("query_string", b""):
      return await self.app(scope, receive, send)
    cookie = f"{COOKIE}={self.access.token}; Path=/; HttpOnly; SameSite=Strict".encode()

    async def with_cookie(message):
      if message["type"] == "http.response.start":
        message = dict(message, headers=[*message.get("headers", ()), (b"set-cookie", cookie)])
      await send(message)

    return await self.app(scope, receive, with_cookie)
