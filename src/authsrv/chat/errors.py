"""
Why a chat-platform token cannot be handed out. Each maps to one answer of
the internal chat-token endpoint (documented in the README).
"""


class ChatError(Exception):
    """Base: C{code} is the internal API's error code, C{status} its HTTP status."""

    code = "chat_error"
    status = 500


class ChatNotLinked(ChatError):
    """The user has no linked account with a provider token."""

    code = "chat_not_linked"
    status = 404


class ChatProviderUnavailable(ChatError):
    """The provider could not be reached or failed; the stored token was kept."""

    code = "chat_provider_unavailable"
    status = 503


class ChatRefreshRefused(ChatError):
    """The provider refused the stored refresh token: the user must link again."""

    code = "chat_refresh_refused"
    status = 502
