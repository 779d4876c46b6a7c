"""The agent's only HTTP speaker: a small JSON client for Placement.

Every request carries the one microversion ``microversions.REQUIRED``.
Failures come back as typed errors a caller can act on:

* ``GenerationConflict`` (409 placement.concurrent_update): a provider or
  consumer generation was stale; re-read and retry the plan.
* ``InventoryInUse`` (409 placement.inventory.inuse): inventory would drop
  below what is allocated; the caller needs a reshape or must wait.
* ``DuplicateName`` (409 placement.duplicate_name): a provider of that name
  exists already (adopt it).
* ``NotFound`` (404), ``AuthError`` (401/403).
* ``Unavailable``: no answer (refused, timeout, TLS) or 5xx, after a bounded
  number of retries. A retried POST may have been applied the first time, so
  its retry can end in a 409 the caller already handles.
* ``BadAnswer``: a 2xx whose body is not Placement's (not JSON, empty for a
  read, a read's fields missing): something else answers at the endpoint.

Why one module over 500 lines: it is the one HTTP gateway, and its typed
operations, retries, deadline and the checks of every answer must stay in
one place so that no caller speaks HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional

import tenacity
from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint

from node_agent import errors
from node_agent.placement import microversions, routes

# The gateway raises these; callers catch them from here.
from node_agent.placement.errors import (  # noqa: F401
    AuthError,
    BadAnswer,
    DuplicateName,
    GenerationConflict,
    InventoryInUse,
    NotFound,
    PlacementError,
    Unavailable,
    error_for,
    shown,
)
from node_agent.placement.microversions import version_refusal

if TYPE_CHECKING:
    from node_agent.placement.planner import Change

LOG = logging.getLogger(__name__)

SERVICE_TYPE = "placement"
# The config section of the keystoneauth options a client is built from
# (from_conf), named where a message points at one of them. The option table
# registers them there (config/options.py: PLACEMENT_GROUP); the client takes
# the name, not the table, so placement/ does not import config/ (issue 25).
CONF_GROUP = "placement"
NO_RESPONSE = 0  # status recorded in RequestStats when nothing came back
# A cycle's phase (the reshape, the tree sync) ends within this many
# [placement] timeouts, whatever its number of requests (issue 28): a
# Placement that answers each read just under the timeout would otherwise
# hold a reshape of N consumers for N timeouts. 20 x 30 s is 10 minutes; a
# reshape of 1,000 consumers takes seconds (BENCHMARKS.md). The next cycle
# starts over from what Placement shows.
PHASE_TIMEOUTS = 20
DEFAULT_TIMEOUT = 30  # seconds: [placement] timeout's default (config/options.py)
# Fields of Placement's read answers the typed reads check for.
_PROVIDERS = "resource_providers"
_GENERATION = "resource_provider_generation"


@dataclass
class RequestStats:
    """Counts of every HTTP request sent, retries included (status 0 = no
    response), and the most recent ones in ``log``. Counters, not a scan of
    the log: a service sends requests for months."""

    LOG_LIMIT = 1000

    log: list[tuple[str, str, int]] = field(default_factory=list)
    reads: int = 0
    writes: int = 0
    by_status: Counter = field(default_factory=Counter)  # (method, status) -> n

    def record(self, method: str, path: str, status: int) -> None:
        self.log.append((method, path, status))
        if len(self.log) > self.LOG_LIMIT:
            del self.log[: len(self.log) - self.LOG_LIMIT]
        if method == "GET":
            self.reads += 1
        else:
            self.writes += 1
        self.by_status[(method, status)] += 1

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def reset(self) -> None:
        self.log.clear()
        self.reads = self.writes = 0
        self.by_status.clear()


class _Retryable(Exception):
    """One attempt failed in a way worth trying again."""

    def __init__(self, error: PlacementError):
        super().__init__(str(error))
        self.error = error


def _error_fields(response) -> tuple[str | None, str]:
    """(code, detail) from Placement's JSON error body (1.23+), tolerant of
    the plain-text bodies a proxy in front of it may send."""
    try:
        first = response.json()["errors"][0]
        detail = first.get("detail") or first.get("title") or ""
        return first.get("code"), " ".join(detail.split())
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None, (response.text or "").strip()[:500]


def _connection_reason(exc: Exception) -> str:
    """The innermost reason of a connection failure, without urllib3's noise."""
    text = str(exc)
    for marker in ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed"):
        if marker in text:
            return "TLS certificate verify failed (check [placement] cafile)"
    for reason in (
        "Connection refused",
        "Name or service not known",
        "timed out",
        "No route to host",
        "Network is unreachable",
    ):
        if reason in text:
            return reason.lower()
    return text


class PlacementReads:
    """Placement's reads as typed operations, over the ``get`` of the class
    that mixes them in (:class:`PlacementClient`, and the read-only gateway
    of companion mode): callers name what they want, never a URL."""

    def get(self, path: str, microversion: str | None = None) -> dict:
        raise NotImplementedError

    def _read(self, path: str, *fields: str, microversion: str | None = None) -> dict:
        """``GET path``, whose answer must hold ``fields``; BadAnswer otherwise
        (a KeyError deep in a caller would say nothing of the request)."""
        body = self.get(path, microversion=microversion)
        missing = [f for f in fields if not isinstance(body, dict) or f not in body]
        if missing:
            raise BadAnswer(
                f"GET {path}: the answer lacks {', '.join(missing)}, so it is not "
                f"Placement's: {shown(json.dumps(body))}. Check that the endpoint "
                f"({getattr(self, 'endpoint', '?')}) is Placement.",
                method="GET",
                path=path,
            )
        return body

    def providers_named(self, name: str) -> list[dict]:
        """The providers called ``name`` (none or one)."""
        return self._read(routes.providers_named(name), _PROVIDERS)[_PROVIDERS]

    def providers_with_trait(self, trait: str) -> list[dict]:
        return self._read(routes.providers_with_trait(trait), _PROVIDERS)[_PROVIDERS]

    def sharing_providers(self, aggregates, trait: str) -> list[dict]:
        """The providers in any of ``aggregates`` carrying ``trait``: one GET."""
        path = routes.sharing_providers(sorted(aggregates), trait)
        return self._read(path, _PROVIDERS)[_PROVIDERS]

    def providers_in_tree(self, root_uuid: str) -> list[dict]:
        return self._read(routes.providers_in_tree(root_uuid), _PROVIDERS)[_PROVIDERS]

    def provider(self, uuid: str) -> dict:
        return self._read(routes.provider(uuid), "uuid", "generation")

    def inventories(self, uuid: str) -> dict:
        """``{resource_provider_generation, inventories}`` of one provider."""
        return self._read(routes.inventories(uuid), _GENERATION, "inventories")

    def traits(self, uuid: str) -> dict:
        """``{resource_provider_generation, traits}`` of one provider."""
        return self._read(routes.traits(uuid), _GENERATION, "traits")

    def aggregates(self, uuid: str) -> dict:
        """``{resource_provider_generation, aggregates}`` of one provider (1.19)."""
        return self._read(routes.aggregates(uuid), _GENERATION, "aggregates")

    def usages(self, uuid: str) -> dict:
        """``{resource_provider_generation, usages}`` of one provider."""
        return self._read(routes.usages(uuid), _GENERATION, "usages")

    def provider_allocations(self, uuid: str) -> dict:
        """``{resource_provider_generation, allocations}``: every consumer's
        resources on one provider."""
        return self._read(routes.provider_allocations(uuid), _GENERATION, "allocations")

    def consumer_allocations(self, consumer: str, microversion: str | None = None) -> dict:
        return self._read(
            routes.consumer_allocations(consumer), "allocations", microversion=microversion
        )


class PlacementClient(PlacementReads):
    MICROVERSION = microversions.REQUIRED

    def __init__(
        self,
        adapter: ks_adapter.Adapter,
        retries: int = 3,
        backoff: float = 0.2,
        group: str = CONF_GROUP,
    ):
        """``retries`` is how many times a failed attempt is repeated (so
        up to ``retries + 1`` requests); waits grow exponentially from
        ``backoff`` seconds, capped at 5 s. ``group``: the config section
        of its options, as its messages name it."""
        self._adapter = adapter
        self._group = group
        self._retries = max(0, retries)
        self._backoff = backoff
        self.stats = RequestStats()
        self.last_request_id: str | None = None
        # (monotonic end, what, seconds) of the phase under way, if any.
        self._deadline: tuple[float, str, float] | None = None
        # The server's newest microversion, once check_version() asked.
        self.server_max: str | None = None

    @classmethod
    def from_conf(cls, conf, group: str = CONF_GROUP, **kw) -> "PlacementClient":
        """Build from the keystoneauth session, auth and adapter options in
        ``conf``'s section ``group`` (``[placement]``). Raises ConfigError
        naming the options to set."""
        try:
            auth = ks_loading.load_auth_from_conf_options(conf, group)
        except ks_exc.MissingRequiredOptions as exc:
            names = ", ".join(f"[{group}] {opt.dest}" for opt in exc.options)
            raise errors.ConfigError(
                f"[{group}] auth_type={conf[group].auth_type} needs {names}; "
                f"set them in the config file."
            ) from exc
        except ks_exc.OptionError as exc:
            # The plugin's own check (a secret it needs, two options that
            # exclude each other): its words, and where to fix them.
            raise errors.ConfigError(
                f"[{group}] auth_type={conf[group].auth_type}: {exc} Set the "
                f"plugin's options in [{group}]."
            ) from exc
        except ks_exc.NoMatchingPlugin as exc:
            raise errors.ConfigError(
                f"[{group}] auth_type={conf[group].auth_type!r} is not a known "
                f"keystoneauth plugin; use for example 'password' or "
                f"'v3applicationcredential'."
            ) from exc
        if auth is None:
            raise errors.ConfigError(
                f"[{group}] auth_type is not set; set it (for example "
                f"'password' with auth_url, username, password, "
                f"project_name, user_domain_name, project_domain_name)."
            )
        if conf[group].insecure:
            LOG.warning(
                "[%s] insecure = true: the Placement server's TLS "
                "certificate is NOT verified; anyone on the path can "
                "impersonate Placement. Set cafile instead.",
                group,
            )
        session = ks_loading.load_session_from_conf_options(conf, group, auth=auth)
        adapter = ks_loading.load_adapter_from_conf_options(conf, group, session=session, auth=auth)
        if not adapter.service_type:
            adapter.service_type = SERVICE_TYPE
        return cls(adapter, group=group, **kw)

    @classmethod
    def for_endpoint(
        cls, url: str, token: str = "admin", timeout: float = 30, **kw
    ) -> "PlacementClient":
        """A client for a known URL and fixed token (noauth2 test servers,
        the embedded Placement of ``make run``)."""
        auth = token_endpoint.Token(url, token)
        session = ks_session.Session(auth=auth, timeout=timeout)
        adapter = ks_adapter.Adapter(session, service_type=SERVICE_TYPE, endpoint_override=url)
        return cls(adapter, **kw)

    @property
    def adapter(self) -> ks_adapter.Adapter:
        """The keystoneauth adapter, to share one session between clients."""
        return self._adapter

    @property
    def endpoint(self) -> str:
        try:
            return self._adapter.get_endpoint() or "?"
        except ks_exc.ClientException:
            return "?"

    def check_version(self) -> str:
        """``GET /``; returns the server's newest microversion. Raises
        PlacementError if it cannot serve ``MICROVERSION``."""
        root = self._request("GET", "/", None, versioned=False)
        try:
            version = next(v for v in root["versions"] if v["id"] == "v1.0")
            server_min, server_max = (version["min_version"], version["max_version"])
        except (StopIteration, KeyError, TypeError) as exc:
            raise BadAnswer(
                f"{self.endpoint} does not look like Placement: GET / "
                f"answered {shown(json.dumps(root))}",
                method="GET",
                path="/",
            ) from exc
        refusal = version_refusal(self.endpoint, server_min, server_max, self.MICROVERSION)
        if refusal:
            raise PlacementError(refusal, method="GET", path="/")
        self.server_max = server_max
        return server_max

    def get(self, path: str, microversion: str | None = None) -> dict:
        """``microversion`` overrides ``MICROVERSION`` for this read only (a
        read's answer may grow at a newer version; writes keep the one)."""
        return self._request("GET", path, None, microversion=microversion)

    def put(self, path: str, body) -> dict | None:
        return self._request("PUT", path, body)

    def post(self, path: str, body) -> dict | None:
        return self._request("POST", path, body)

    def delete(self, path: str) -> None:
        self._request("DELETE", path, None)

    # -- typed writes (the reads are PlacementReads')

    def create_provider(self, body: dict) -> dict | None:
        return self.post(routes.PROVIDERS, body)

    def put_inventories(self, uuid: str, body: dict) -> dict:
        return self._request("PUT", routes.inventories(uuid), body)

    def put_traits(self, uuid: str, body: dict) -> dict:
        return self._request("PUT", routes.traits(uuid), body)

    def put_aggregates(self, uuid: str, body: dict) -> dict:
        return self._request("PUT", routes.aggregates(uuid), body)

    def delete_provider(self, uuid: str) -> None:
        self._request("DELETE", routes.provider(uuid), None)

    def reshape(self, body: dict) -> None:
        self.post(routes.RESHAPER, body)

    def send(self, change: Change) -> dict | None:
        """Send one planned change as it was planned (its body, if any)."""
        return self._request(change.method, change.path, change.body)

    @property
    def timeout(self) -> float | None:
        """The session's per-request timeout ([placement] timeout)."""
        return getattr(self._adapter.session, "timeout", None)

    @contextmanager
    def deadline(self, what: str, seconds: float | None = None) -> Iterator[None]:
        """Every request in the block ends within ``seconds`` (default
        :data:`PHASE_TIMEOUTS` request timeouts) of the block's start: each
        request's timeout is cut to what is left, and one that would start
        later is not sent (Unavailable naming ``what``). A nested block
        keeps the tighter end."""
        if seconds is None:
            seconds = PHASE_TIMEOUTS * (self.timeout or DEFAULT_TIMEOUT)
        outer = self._deadline
        end = time.monotonic() + seconds
        if outer is not None and outer[0] < end:
            end, what, seconds = outer
        self._deadline = (end, what, seconds)
        try:
            yield
        finally:
            self._deadline = outer

    def _time_left(self, method: str, path: str) -> float | None:
        """The timeout of the next request under the phase's deadline (None:
        the session's); Unavailable when the phase has no time left."""
        if self._deadline is None:
            return None
        end, what, seconds = self._deadline
        left = end - time.monotonic()
        if left <= 0:
            raise Unavailable(
                f"{method} {path} not sent: {what} did not finish within its deadline "
                f"of {seconds:g}s ({PHASE_TIMEOUTS} x [{self._group}] timeout); Placement "
                f"at {self._where()} answers too slowly",
                method=method,
                path=path,
            )
        return min(left, self.timeout) if self.timeout else left

    def _where(self) -> str:
        return getattr(self._adapter, "endpoint_override", None) or "the catalog endpoint"

    def _request(
        self, method: str, path: str, body, versioned: bool = True, microversion: str | None = None
    ):
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(self._retries + 1),
            wait=tenacity.wait_exponential(multiplier=self._backoff, max=5),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            return retrying(self._attempt, method, path, body, versioned, microversion)
        except _Retryable as exc:
            raise exc.error from exc.__cause__

    def _attempt(
        self,
        method: str,
        path: str,
        body: Optional[dict],
        versioned: bool,
        microversion: Optional[str] = None,
    ) -> Any:
        kwargs: dict[str, Any] = {"raise_exc": False}
        if versioned:
            kwargs["microversion"] = microversion or self.MICROVERSION
        if body is not None:
            kwargs["json"] = body
        left = self._time_left(method, path)
        if left is not None:
            kwargs["timeout"] = left
        try:
            response = self._adapter.request(path, method, **kwargs)
        except ks_exc.ConnectTimeout as exc:
            # Not retried: a server that accepts and never answers would
            # hold the cycle for (retries + 1) timeouts.
            self.stats.record(method, path, NO_RESPONSE)
            timeout = self.timeout
            why = f"[{self._group}] timeout"
            if left is not None and (timeout is None or left < timeout):
                assert self._deadline is not None
                timeout, why = round(left, 1), f"what was left of {self._deadline[1]}'s deadline"
            raise Unavailable(
                f"{method} {path}: Placement at {self._where()} did not answer "
                f"within {timeout or '?'}s ({why}): {exc}",
                method=method,
                path=path,
            ) from exc
        except (ks_exc.ConnectionError, ks_exc.RequestTimeout, ks_exc.DiscoveryFailure) as exc:
            # keystoneauth's message names the URL; it never holds the token.
            self.stats.record(method, path, NO_RESPONSE)
            raise _Retryable(
                Unavailable(
                    f"{method} {path}: Placement at {self._where()} "
                    f"is unreachable: {_connection_reason(exc)}",
                    method=method,
                    path=path,
                )
            ) from exc
        except ks_exc.EndpointNotFound as exc:
            raise errors.ConfigError(
                f"No Placement endpoint found in the service catalog: {exc}; "
                f"check [{self._group}] region_name, valid_interfaces or "
                f"endpoint_override."
            ) from exc
        except ks_exc.Unauthorized as exc:
            raise AuthError(
                f"{method} {path}: authentication failed: {exc}",
                status=401,
                method=method,
                path=path,
            ) from exc
        status = response.status_code
        request_id = response.headers.get("x-openstack-request-id")
        self.last_request_id = request_id
        self.stats.record(method, path, status)
        LOG.debug("%s %s -> %s (%s)", method, path, status, request_id)
        if status < 400:
            return self._decoded(method, path, status, response)
        code, detail = _error_fields(response)
        error = error_for(status, code, detail, method, path, request_id)
        if status >= 500:
            raise _Retryable(error)
        raise error

    def _decoded(self, method: str, path: str, status: int, response) -> Any:
        """The JSON of a success answer. Placement answers a read with a JSON
        object and a write with JSON or nothing (204); anything else is
        BadAnswer, naming the request and the start of the body, not a
        ValueError or a TypeError in the caller."""
        where = f"{method} {path} -> {status} from {self._where()}"
        kind = response.headers.get("content-type") or "no content type"
        if not response.content:
            if method == "GET":
                raise BadAnswer(
                    f"{where}: empty answer ({kind}); Placement answers "
                    "every read with a JSON object. Check that the "
                    "endpoint is Placement, not a proxy.",
                    status=status,
                    method=method,
                    path=path,
                )
            return None
        try:
            body = response.json()
        except ValueError:
            raise BadAnswer(
                f"{where}: not JSON ({kind}): {shown(response.text)}. Check "
                "that the endpoint is Placement, not a proxy's page.",
                status=status,
                method=method,
                path=path,
            ) from None
        if method == "GET" and not isinstance(body, dict):
            raise BadAnswer(
                f"{where}: a JSON {type(body).__name__}, not the object "
                f"Placement answers: {shown(response.text)}.",
                status=status,
                method=method,
                path=path,
            )
        return body

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        # DEBUG: the caller reports the outcome once; an outage must not
        # write a line per retry.
        outcome, action = state.outcome, state.next_action
        if outcome is None or action is None:  # both are set before a sleep
            return
        LOG.debug(
            "%s; retry %d of %d in %.1fs",
            outcome.exception(),
            state.attempt_number,
            self._retries,
            action.sleep,
        )
