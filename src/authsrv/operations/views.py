"""
Records as both front ends show them (JSON objects of the admin API, the
operator command's --json): no secret, hash or cookie digest, times as
seconds since the epoch.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from authsrv.operations.keys import ADOPTED
from authsrv.records import Ban, BrowserSession, Client, Consent, Grant, KeyInfo, Rotation, User


def client_view(client: Client) -> dict[str, Any]:
    """A client as the front ends show it: every setting, no secret hash."""
    data = attrs.asdict(client, recurse=False)
    for hidden in ("secret_hash", "previous_secret_hash", "registration_token_hash", "sealed_secret"):
        del data[hidden]
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    data["type"] = "public" if client.is_public else "confidential"
    if client.jwks is not None:
        data["jwks"] = json.loads(client.jwks)
    if client.previous_secret_hash is None:
        data["previous_secret_until"] = None
    return data


def user_view(user: User) -> dict[str, Any]:
    return attrs.asdict(user)


def ban_view(ban: Ban | None) -> dict[str, Any] | None:
    return None if ban is None else attrs.asdict(ban)


def grant_view(grant: Grant) -> dict[str, Any]:
    data = attrs.asdict(grant, recurse=False)
    data["scope"] = sorted(grant.scope)
    data["resource"] = list(grant.resource)
    return data


def session_view(session: BrowserSession) -> dict[str, Any]:
    return {"sid": session.sid, "sub": session.sub, "auth_time": session.auth_time,
            "created_at": session.created_at, "expires_at": session.expires_at}


def consent_view(consent: Consent) -> dict[str, Any]:
    return {"client_id": consent.client_id, "scope": sorted(consent.scope), "created_at": consent.created_at}


def key_view(key: KeyInfo) -> dict[str, Any]:
    return attrs.asdict(key)


def rotation_view(rotation: Rotation) -> dict[str, Any]:
    """The keys after a rotation, and whether it rotated or, with a note why not, adopted another's."""
    view: dict[str, Any] = {"keys": [key_view(k) for k in rotation.keys], "rotated": rotation.rotated}
    if not rotation.rotated:
        view["note"] = ADOPTED
    return view
