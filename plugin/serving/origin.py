"""Whether a request that writes (``POST /capture``) was sent to the address TensorBoard serves on,
from a page of that same origin: the defence against DNS rebinding, where a page of another site
renames its own host to TensorBoard's address (``evil.example`` resolving to 127.0.0.1) and so
sends, as the same origin as itself, what TensorBoard would otherwise accept.

The ``Host`` a browser sends is the name in the address bar, which a page cannot choose. It is
accepted when its port is the one TensorBoard is bound to (the server's own socket, not the
header) and its name is one that reaches TensorBoard without an attacker's DNS:

- ``localhost``, or any IP address (``127.0.0.1``, ``[::1]``, a LAN address: rebinding needs a
  name the attacker's DNS answers for);
- the ``--host`` TensorBoard was given;
- with ``--bind_all`` (or ``--host 0.0.0.0`` / ``::``), this machine's host name and fully
  qualified name (what TensorBoard prints as its address then);
- a name the user allows with ``--phaseprof_allowed_hosts``, comma-separated, for a reverse proxy:
  ``name`` accepts the Host ``name`` (a browser leaves out the scheme's default port) or
  ``name:<TensorBoard's port>``; ``name:port`` accepts exactly that.

An ``Origin``, when the browser sends one, must be that same origin: ``http(s)://`` and the same
name and port as the ``Host``.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

#: The host names TensorBoard binds to for "every interface".
_WILDCARDS = ("0.0.0.0", "::")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split(host: str) -> tuple[str, int | None]:
    """``name[:port]`` (``[v6]:port`` too) as a lower-case name without brackets and a port;
    ValueError if it is not one."""
    parsed = urlsplit("//" + host)
    name, port = parsed.hostname, parsed.port  # .port raises ValueError for a bad one
    if not name or parsed.username is not None or parsed.path or parsed.query or parsed.fragment:
        raise ValueError(host)
    return name.lower().rstrip("."), port


def allowed_hosts(flag: str | None) -> frozenset[tuple[str, int | None]]:
    """``--phaseprof_allowed_hosts``: comma-separated ``name`` or ``name:port``; ValueError naming
    an entry that is neither (TensorBoard refuses the flag at start)."""
    out = set()
    for entry in (flag or "").split(","):
        if entry.strip():
            try:
                out.add(_split(entry.strip()))
            except ValueError:
                raise ValueError(f"{entry.strip()!r} is not name or name:port") from None
    return frozenset(out)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Served:
    """The names TensorBoard serves on, from its flags (``host``, ``bind_all``,
    ``phaseprof_allowed_hosts``; none in a bare WSGI app: localhost and addresses only)."""

    def __init__(self, flags) -> None:
        host = (getattr(flags, "host", None) or "").strip("[]").lower()
        names = {"localhost"}
        if host and host not in _WILDCARDS:
            names.add(host.rstrip("."))
        if getattr(flags, "bind_all", False) or host in _WILDCARDS:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        self.names = frozenset(names)
        self.allowed = allowed_hosts(getattr(flags, "phaseprof_allowed_hosts", None))

    def refusal(self, environ) -> str | None:
        """Why this request may not write, or None if its Host and Origin are TensorBoard's."""
        host = environ.get("HTTP_HOST", "")
        scheme = environ.get("wsgi.url_scheme", "http")
        try:
            name, port = _split(host)
            bound = int(environ.get("SERVER_PORT") or 0)
        except ValueError:
            return f"the Host header {host[:100]!r} is not a host name"
        at = port if port is not None else _DEFAULT_PORTS.get(scheme)
        allowed = ((name, port) in self.allowed
                   or ((name, None) in self.allowed and port in (None, bound))
                   or ((_is_address(name) or name in self.names) and at == bound))
        if not allowed:
            return (f"the Host {host[:100]!r} is not an address this TensorBoard serves on (a "
                    "page of another site pointing its name here?); allow it with "
                    "--phaseprof_allowed_hosts")
        origin = environ.get("HTTP_ORIGIN")
        if origin is None:
            return None
        parsed = urlsplit(origin)
        try:
            default = _DEFAULT_PORTS.get(parsed.scheme)
            same = (default is not None and not parsed.path and parsed.hostname is not None
                    and (parsed.hostname.rstrip("."), parsed.port or default)
                    == (name, port or default))
        except ValueError:  # a bad port
            same = False
        if not same:
            return f"the Origin {origin[:100]!r} is not this TensorBoard's ({scheme}://{host[:80]})"
        return None
