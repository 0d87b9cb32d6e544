"""
Prometheus metrics (C{[metrics] listen}): what an operator watches, with
label sets that stay bounded whatever clients send. No label ever holds a
user id, a token, a raw path or a client id the server did not
authenticate.

Where each figure comes from:

  - HTTP requests, latency and 429s: the site's request class reports each
    finished request once (L{authsrv.web.request.BoundedRequest}), labelled
    by the route it matched (L{authsrv.web.routes}), never its path.
  - logins, tokens issued, reuse, revocations, back-channel logouts: the
    audit events (L{authsrv.events}), read by a twisted.logger observer, so
    that the flows which already say what happened do not say it twice.
  - store and identity-backend calls: the observers the stores and the
    identity chain report C{(label, seconds, failed)} to.
  - signing-key age and the process: read at scrape time.
  - log lines lost to a full disk: the log files report each loss.

With several workers (L{authsrv.workers}) every worker counts into files of
its own in a directory the parent made (prometheus_client's multiprocess
mode, chosen by C{PROMETHEUS_MULTIPROC_DIR} in the worker's environment),
and worker 0's C{/metrics} adds them all up, those of a worker that died
included, so that a counter never goes back: the parent folds a dead
worker's files into one file per kind (L{fold_dead_process}), so that the
directory, and the work of every scrape, do not grow with each worker
started again. The process figures are worker 0's own.

The hot path of a request is two dict lookups, a counter increment and a
histogram observation on children bound once per label set.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from authsrv.flows.backchannel import DELIVERED, REFUSED

AUDIT_NAMESPACE = "authsrv.audit"
OTHER = "other"
"""The label of whatever is not worth a series of its own: an unmatched route, a client past the cap."""
MAX_CLIENT_LABELS = 100
"""Distinct client ids labelled by name; later ones count as L{OTHER}."""
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TOO_MANY_REQUESTS = 429

LOGIN_OUTCOMES = ("success", "wrong_password", "unknown_user", "throttled", "suspended", "unavailable")
_FAILED_LOGINS = {"wrong_password": "wrong_password", "unknown_user": "unknown_user"}
"""A failed login's reason, as a label; any other reason (an outage, a full queue) is C{unavailable}."""


SHARED_KINDS = ("counter", "histogram")
"""The kinds of metric the workers count into shared files: their values add up across processes."""
DEAD = "dead"
"""Stands for the pid in the name of the files a dead worker's counts are folded into."""


def fold_dead_process(directory: str, pid: int) -> None:
    """
    Add the counts of the process C{pid}, which has exited, to the files of
    the dead ones in C{directory}, then remove its own files. A scrape
    under way may see its counts twice, or miss a file, once.
    """
    for kind in SHARED_KINDS:
        source = os.path.join(directory, f"{kind}_{pid}.db")
        if not os.path.exists(source):
            continue
        folded = MmapedDict(os.path.join(directory, f"{kind}_{DEAD}.db"))
        try:
            for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(source):
                total, _ = folded.read_value(key)
                folded.write_value(key, total + value, timestamp)
        finally:
            folded.close()
        os.remove(source)


class _Route:
    """The children of one route: its latency, its 429s and, by status, its count."""

    __slots__ = ("route", "latency", "limited", "by_status")

    def __init__(self, route: str, latency, limited):
        self.route = route
        self.latency = latency
        self.limited = limited
        self.by_status: dict[int, object] = {}


class KeyAge:
    """Seconds since each algorithm's active signing key was activated, read at scrape time."""

    def __init__(self, keystore, clock):
        self._keystore = keystore
        self._clock = clock

    def collect(self):
        family = GaugeMetricFamily(
            "authsrv_signing_key_age_seconds", "Seconds since the active signing key of each algorithm was activated",
            labels=["alg"],
        )
        now = self._clock.seconds()
        for info in self._keystore.keys():
            if info.state == "active" and info.activated_at is not None:
                family.add_metric([info.alg], now - info.activated_at)
        yield family


class Metrics:
    """
    Every metric of one server, in a registry of its own (the one
    C{/metrics} serves); with C{shared_dir}, that registry reads every
    worker's counts from there instead.
    """

    def __init__(self, shared_dir: str | None = None):
        self.registry = exposed = CollectorRegistry()
        ProcessCollector(registry=exposed)
        PlatformCollector(registry=exposed)
        registry: CollectorRegistry | None = exposed
        if shared_dir is not None:
            MultiProcessCollector(exposed, path=shared_dir)
            registry = None
        self._requests = Counter(
            "authsrv_http_requests", "HTTP requests answered, by route pattern and status", ["route", "status"],
            registry=registry,
        )
        self._latency = Histogram(
            "authsrv_http_request_duration_seconds", "Time from a whole request to its answer, by route pattern",
            ["route"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self._limited = Counter(
            "authsrv_rate_limited_requests",
            "Requests refused with 429 (client and address rates, the login throttle, the pending-request cap)",
            ["route"], registry=registry,
        )
        self._logins = Counter("authsrv_logins", "Password logins by outcome", ["outcome"], registry=registry)
        self._login = {outcome: self._logins.labels(outcome) for outcome in LOGIN_OUTCOMES}
        self._tokens = Counter(
            "authsrv_tokens_issued", "Token responses by grant type and client", ["grant_type", "client_id"],
            registry=registry,
        )
        self._reuse = Counter(
            "authsrv_reuse_detected", "Replayed authorization codes and rotated refresh tokens; each revokes its grant",
            ["kind"], registry=registry,
        )
        self._revocations = Counter(
            "authsrv_revocations",
            "Revocations: a client's access or refresh token, a grant of a user no longer allowed, an operator's",
            ["kind"], registry=registry,
        )
        self._backchannel = Counter(
            "authsrv_backchannel_logouts", "Back-channel logout deliveries by result (delivered, refused, failed)",
            ["result"], registry=registry,
        )
        self._store_seconds = Histogram(
            "authsrv_store_call_duration_seconds", "Store calls by label", ["call"], buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._store_errors = Counter(
            "authsrv_store_call_errors", "Store calls that failed, by label", ["call"], registry=registry
        )
        self._identity_seconds = Histogram(
            "authsrv_identity_call_duration_seconds", "Identity backend calls by backend and call",
            ["backend", "call"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self._identity_errors = Counter(
            "authsrv_identity_call_errors", "Identity backend calls that failed (the backend could not answer)",
            ["backend", "call"], registry=registry,
        )
        self._lines_dropped = Counter(
            "authsrv_log_lines_dropped",
            "Lines of the audit or access log lost because the file refused them (a full disk)", ["log"],
            registry=registry,
        )
        self._routes: dict[str | None, _Route] = {}
        self._calls: dict[str, tuple] = {}
        self._backend_calls: dict[str, dict[str, tuple]] = {}
        self._clients: set[str] = set()
        self._audit = {
            "login.succeeded": lambda e: self._login["success"].inc(),
            "login.failed": self._login_failed,
            "login.throttled": lambda e: self._login["throttled"].inc(),
            "login.suspended": lambda e: self._login["suspended"].inc(),
            "token.issued": lambda e: self._tokens.labels(e["grant_type"], self._client(e["client_id"])).inc(),
            "code.reused": lambda e: self._reuse.labels("code").inc(),
            "refresh.reused": lambda e: self._reuse.labels("refresh").inc(),
            "token.revoked": lambda e: self._revocations.labels(e["kind"]).inc(),
            "grant.revoked": lambda e: self._revocations.labels("grant").inc(),
            "user.grants_revoked": lambda e: self._revocations.labels("operator").inc(e["count"]),
            "logout.backchannel": self._backchannel_logout,
        }

    def watch_keys(self, keystore, clock) -> None:
        """Report the age of C{keystore}'s active keys, on C{clock}."""
        self.registry.register(KeyAge(keystore, clock))

    def watch_log_file(self, name: str, file) -> None:
        """Count the lines C{file} (a L{authsrv.logfile.LineFile}) loses, labelled C{name}."""
        file.on_dropped = self._lines_dropped.labels(name).inc

    # --- HTTP, from the request class -------------------------------------

    def request_finished(self, route: str | None, status: int, seconds: float) -> None:
        """One answered request; C{route} is its pattern, or None when it matched none."""
        children = self._routes.get(route)
        if children is None:
            children = self._routes[route] = self._bind_route(route)
        counter = children.by_status.get(status)
        if counter is None:
            counter = children.by_status[status] = self._requests.labels(children.route, str(status))
        counter.inc()  # type: ignore[attr-defined]
        children.latency.observe(seconds)
        if status == TOO_MANY_REQUESTS:
            children.limited.inc()

    def _bind_route(self, route: str | None) -> _Route:
        label = route or OTHER
        return _Route(label, self._latency.labels(label), self._limited.labels(label))

    # --- stores and identity backends -------------------------------------

    def store_call(self, label: str, seconds: float, failed: bool) -> None:
        """The observer stores take (L{authsrv.store.observer})."""
        children = self._calls.get(label)
        if children is None:
            children = self._calls[label] = (self._store_seconds.labels(label), self._store_errors.labels(label))
        children[0].observe(seconds)
        if failed:
            children[1].inc()

    def identity_call(self, backend: str, call: str, seconds: float, failed: bool) -> None:
        """The observer the identity chain takes (L{authsrv.identity.chain.IdentityChain})."""
        calls = self._backend_calls.get(backend)
        if calls is None:
            calls = self._backend_calls[backend] = {}
        children = calls.get(call)
        if children is None:
            children = calls[call] = (
                self._identity_seconds.labels(backend, call), self._identity_errors.labels(backend, call)
            )
        children[0].observe(seconds)
        if failed:
            children[1].inc()

    # --- audit events -----------------------------------------------------

    def audit_observer(self, event: dict) -> None:
        """A twisted.logger observer: counts the audit events it knows, ignores every other event."""
        if event.get("log_namespace") != AUDIT_NAMESPACE:
            return
        count = self._audit.get(event.get("event"))  # type: ignore[arg-type]
        if count is not None:
            count(event)

    def _login_failed(self, event: dict) -> None:
        reason = str(event.get("reason", "")).replace(" ", "_")
        self._login[_FAILED_LOGINS.get(reason, "unavailable")].inc()

    def _backchannel_logout(self, event: dict) -> None:
        outcome = str(event.get("outcome", ""))
        self._backchannel.labels(
            "delivered" if outcome.startswith(DELIVERED) else "refused" if outcome.startswith(REFUSED) else "failed"
        ).inc()

    def _client(self, client_id: str) -> str:
        """An authenticated client's id, while fewer than L{MAX_CLIENT_LABELS} have one; else L{OTHER}."""
        if client_id in self._clients:
            return client_id
        if len(self._clients) < MAX_CLIENT_LABELS:
            self._clients.add(client_id)
            return client_id
        return OTHER
