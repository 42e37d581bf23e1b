"""Study storages as tune names them: which URLs it accepts (`storage_url`: none that keeps nothing once tune
exits), how it prints them (`shown`, `masked`: never a password), and how it reaches PostgreSQL
(`postgresql_engine`: the installed driver, with timeouts, so a server that never answers ends the command).
"""
from __future__ import annotations

import re
import time

from cost_model.nouns.errors import AttuneError

DEFAULT_STORAGE = "sqlite:///studies/attune.sqlite3"


class StudyError(AttuneError, RuntimeError):
    """A study that cannot be opened, created or resumed as asked."""


def storage_url(value: str | None) -> str:
    """--storage as a URL (a bare path is an SQLite file). A storage that would keep nothing once tune exits
    is refused here, before any work: an in-memory SQLite database however spelled (sqlite://, :memory:,
    mode=memory), so an SQLite URL takes no options ('?...'); its default driver is spelled sqlite:/// so that
    the file checks (check_storage) apply to it."""
    if value is None:
        return DEFAULT_STORAGE
    if not value.strip():
        raise StudyError("--storage is empty: give an SQLite file or a URL, or leave it out for the default")
    if "://" not in value and any(ch in value for ch in "?#"):
        # in an SQLite URL they start the query or fragment: the study would go to another file
        raise StudyError(f"--storage {value}: a file name with '?' or '#' cannot be an SQLite URL; rename it")
    url = value if "://" in value else f"sqlite:///{value}"
    scheme, _, rest = url.partition("://")
    if scheme.lower().startswith("sqlite"):
        if scheme.lower() not in ("sqlite", "sqlite+pysqlite"):
            raise StudyError(f"--storage {shown(value)}: tune keeps SQLite studies through the default driver; "
                             f"give sqlite:///FILE or the file's path")
        url = f"sqlite://{rest}"
        if rest.split("?")[0] in ("", "/", "/:memory:"):
            raise StudyError(f"--storage {shown(value)}: an in-memory SQLite database keeps nothing once tune "
                             f"exits; give a file")
        if "?" in rest or "#" in rest:   # mode=memory&uri=true is in memory too; and the file checks read a path
            raise StudyError(f"--storage {shown(value)}: an SQLite URL with options ('?...') is not supported; "
                             f"give the file alone")
    elif scheme.lower() in ("postgres", "postgresql"):
        url = f"postgresql://{rest}"   # SQLAlchemy 2 knows only the long name
    elif not scheme.lower().startswith("postgresql+"):
        # journal://, mysql://...: tune installs no driver for them (SQLAlchemy's error names a plugin or module)
        raise StudyError(f"--storage {shown(value)}: its scheme is not supported; give an SQLite "
                         f"file (or sqlite:///FILE) or a postgresql:// URL")
    return url


def _userinfo_end(url: str) -> int:
    """Where user:password ends in a server URL (its last '@' before any '?': a password may hold an
    unencoded '@' or '/'); -1 when there is none."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower().startswith("sqlite"):
        return -1
    return url.rfind("@", len(scheme) + 3, len(url.split("?")[0]))


def _passwords(url: str) -> list[str]:
    """The secrets a storage URL holds, as written and decoded: its password and any password= option."""
    import urllib.parse

    found = re.findall(r"(?i)[?&]password=([^&#]*)", url)
    end = _userinfo_end(url)
    if end >= 0 and ":" in url[url.index("://") + 3:end]:
        found.append(url[url.index("://") + 3:end].partition(":")[2])
    found += [urllib.parse.unquote(s) for s in found]
    # a driver that splits the URL elsewhere (at the first '@') prints a part of it, as a host name (parts
    # of one or two characters stay: masking them would garble the line)
    found += [part for s in found for part in re.split(r"[@/:?#]", s) if len(part) > 2]
    return sorted({s for s in found if s}, key=len, reverse=True)


def masked(text: str, url: str) -> str:
    """`text` (an error, a line tune prints) with the storage URL's password replaced by *** wherever it is."""
    text = text.replace(url, shown(url))
    for secret in _passwords(url):
        text = text.replace(secret, "***")
    return text


def shown(url: str) -> str:
    """The storage URL as tune prints it: its password and any password= option are ***."""
    end = _userinfo_end(url)
    start = url.find("://") + 3
    if end >= 0 and ":" in url[start:end]:
        url = f"{url[:start]}{url[start:end].partition(':')[0]}:***{url[end:]}"
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


# A server that accepts the connection but never answers (a wedged server or proxy) fails the command in one
# line instead of hanging it: connecting may take this long, and so may the silence while a command waits for
# the server's next byte (a long answer that keeps coming never times out; a lock held over a minute does).
POSTGRES_CONNECT_TIMEOUT_S = 15
POSTGRES_READ_TIMEOUT_S = 60


def postgresql_engine(url: str) -> tuple[str, dict]:
    """A PostgreSQL URL with the driver that is installed, and its engine arguments with the timeouts.
    SQLAlchemy 2.1 reads postgresql:// as psycopg 3; tune's extra installs psycopg2."""
    import importlib.util

    scheme, _, rest = url.partition("://")
    driver = scheme.partition("+")[2].lower()
    if not driver:
        driver = "psycopg" if importlib.util.find_spec("psycopg") or not importlib.util.find_spec("psycopg2") \
            else "psycopg2"
        url = f"postgresql+{driver}://{rest}"
    if driver == "psycopg2":
        import psycopg2.extensions

        # psycopg2 then waits through _wait_for_server (async libpq, which ignores connect_timeout)
        psycopg2.extensions.set_wait_callback(_wait_for_server)
        return url, {}
    if driver == "psycopg":
        return url, {"connect_args": {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}}
    if driver == "pg8000":
        return url, {"connect_args": {"timeout": POSTGRES_READ_TIMEOUT_S}}
    return url, {}


def _wait_for_server(conn) -> None:
    """psycopg2's wait callback: psycopg2.extras.wait_select with a timeout on each wait (the connect
    timeout while connecting, the read timeout after). Ctrl-C ends the wait at once (psycopg2 then closes
    the connection; the server ends the command when it sees that)."""
    import select

    import psycopg2
    from psycopg2.extensions import POLL_OK, POLL_READ, POLL_WRITE, STATUS_SETUP

    connecting = conn.status == STATUS_SETUP
    timeout = POSTGRES_CONNECT_TIMEOUT_S if connecting else POSTGRES_READ_TIMEOUT_S
    deadline = time.monotonic() + timeout   # connecting: one deadline for the whole handshake
    while True:
        state = conn.poll()
        if state == POLL_OK:
            return
        if state not in (POLL_READ, POLL_WRITE):
            raise psycopg2.OperationalError(f"bad state from poll: {state}")
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN if state == POLL_READ else select.POLLOUT)
        left = deadline - time.monotonic() if connecting else timeout
        if left <= 0 or not poller.poll(left * 1000):
            raise psycopg2.OperationalError(f"no answer from the server in {timeout} s"
                                            + (" while connecting" if connecting else "") + " (timeout)")


def unreadable_attribute_at(url: str) -> str | None:
    """tuner.trial_record.unreadable_attribute on the storage at `url`; None when it cannot tell."""
    import sqlalchemy

    from tuner.trial_record import unreadable_attribute

    try:
        engine_url, engine_kwargs = postgresql_engine(url) if url.startswith("postgresql") else (url, {})
        engine = sqlalchemy.create_engine(engine_url, **engine_kwargs)
        try:
            return unreadable_attribute(engine)
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - the search is a courtesy: the original error is raised when it fails
        return None
