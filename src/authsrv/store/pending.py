"""
The cap on sign-ins waiting at the login stage per client address (docs/design.md,
Limits), shared by the SQL stores: one statement says whether the address is
at the cap and, if so, when it falls below it.
"""

from __future__ import annotations

from authsrv.records import LOGIN_STAGE, Interaction
from authsrv.store.rows import Dialect


def busy_until(dialect: Dialect) -> str:
    """
    The expiry of the address's C{cap}-th newest live login-stage
    interaction: no row while it has fewer, else when it falls below the cap.
    """
    marks = {name: dialect.mark.format(name) for name in ("address", "stage", "now", "offset")}
    return (
        "SELECT expires_at FROM interactions"
        " WHERE address = {address} AND stage = {stage} AND expires_at > {now}"
        " ORDER BY expires_at DESC LIMIT 1 OFFSET {offset}"
    ).format(**marks)


def params(interaction: Interaction, cap: int) -> dict:
    """The parameters of L{busy_until}: live means expiring after the new one was made."""
    return {"address": interaction.address, "stage": LOGIN_STAGE, "now": interaction.created_at, "offset": cap - 1}
