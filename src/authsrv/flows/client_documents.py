"""
Client ID metadata documents (the OAuth draft the Model Context Protocol
adopted): a client_id that is an https URL names a JSON document of the
client's metadata, fetched when the client is first seen and cached, so an
agent needs no registration at all. Off unless configured.

The URL is chosen by whoever sends the request, so the document is fetched
through L{authsrv.remote_documents} (no private addresses, a timeout, a size
cap, a cache). It must name itself as client_id (otherwise anyone could
claim another's URL as theirs), register redirect URIs by the rules of any
client plus the registration policy's, name itself by no operator client's
name, and be a public client: it has no secret. Such clients are never
first-party.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from twisted.logger import Logger

from authsrv.flows.registration import OperatorNames, RegistrationPolicy, registered_settings
from authsrv.protocol.clients import uri_characters_problem
from authsrv.protocol.errors import InvalidClientMetadata, OAuthError
from authsrv.records import Client
from authsrv.remote_documents import Busy, RemoteDocumentError, RemoteDocuments

MAX_REFUSED = 10_000
DOCUMENT_SOURCE = "document"
"""C{Client.source} of a client described by its metadata document."""

log = Logger()


def identifier_problem(url: str) -> str | None:
    """
    What the draft (section 3) refuses in a client ID URL beyond what any
    fetch refuses: no path, or a . or .. segment (percent-encoded too), by
    which the URL the user is shown names one document and its server may
    answer with another; None when it has neither.
    """
    path = urlsplit(url).path
    if not path:
        return f"{url} has no path"
    if any(unquote(segment) in (".", "..") for segment in path.split("/")):
        return f"{url} has a . or .. segment in its path"
    return None


def document_client(url: str, document: dict[str, Any], policy: RegistrationPolicy,
                    dpop_offered: bool = False) -> Client:
    """The client the document at C{url} describes, or L{OAuthError} saying what is wrong with it."""
    if document.get("client_id") != url:
        raise InvalidClientMetadata(f"the document's client_id must be its own URL, {url}")
    if "client_secret" in document or "client_secret_expires_at" in document:
        raise InvalidClientMetadata("a client ID metadata document must not carry a client secret")
    settings, _ = registered_settings(document, RegistrationPolicy(
        allowed_redirect_hosts=policy.allowed_redirect_hosts, resources=policy.resources), dpop_offered)
    settings.setdefault("name", url)
    return Client(client_id=url, secret_hash=None, source=DOCUMENT_SOURCE, **settings)


class DocumentClients:
    """
    C{get_client} as L{authsrv.flows.clients.ClientCache} answers it
    (C{clients}), except that a client_id that is a URL is looked up in its
    document; an unusable document is an unknown client, and the log says why.
    One giving its client an operator client's name is unusable (C{names}).
    A refused URL is not fetched again for the policy's C{refetch_after}
    seconds, so that requests naming a slow or broken URL cost no fetch each,
    and then fetched again, its refused document not kept in the cache;
    one not fetched because others were (L{Busy}) may be asked for again at once.
    """

    def __init__(self, clients, documents: RemoteDocuments, policy: RegistrationPolicy, clock, names: OperatorNames,
                 dpop_offered: bool = False):
        self._names = names
        self._dpop_offered = dpop_offered
        self._clients = clients
        self._documents = documents
        self._policy = policy
        self._clock = clock
        self._refused: dict[str, float] = {}
        self._schemes = ("https://", "http://") if documents.policy.allow_http else ("https://",)

    @property
    def assertions(self):
        """The wrapped cache's client assertion checker: a document never names a key, an operator's client may."""
        return self._clients.assertions

    async def secret_key(self) -> bytes:
        return await self._clients.secret_key()

    def seconds(self) -> float:
        return self._clients.seconds()

    async def get_client(self, client_id: str, fresh: bool = False) -> Client | None:
        if not client_id.startswith(self._schemes):
            return await self._clients.get_client(client_id, fresh)
        if uri_characters_problem(client_id) is not None:
            # No URL names a document: not fetched, and its text (a control character or an escape
            # sequence a terminal acts on) never reaches the log.
            return None
        if self._refused.get(client_id, 0.0) > self._clock.seconds():
            return None
        try:
            if problem := identifier_problem(client_id):
                raise InvalidClientMetadata(problem)
            client = document_client(client_id, await self._documents.fetch(client_id), self._policy,
                                     self._dpop_offered)
            await self._names.check(client.name)
            return client
        except Busy as e:
            log.warn("client ID metadata document {url} not fetched: {reason}", url=client_id, reason=str(e))
            return None
        except (RemoteDocumentError, OAuthError) as e:
            log.warn("client ID metadata document {url} refused: {reason}", url=client_id, reason=str(e))
            self._documents.forget(client_id)  # the draft (Metadata Caching): an invalid document is not cached
            if len(self._refused) >= MAX_REFUSED:
                self._refused.clear()
            self._refused[client_id] = self._clock.seconds() + self._documents.policy.refetch_after
            return None
