"""
Every interface of authsrv in one place.

Three roles are pluggable, each through a factory plugin found with
L{twisted.plugin.getPlugins} and chosen by its C{name} in the config file:
identity backends, stores and keystores. A third party ships a backend by
shipping a dropin module whose factories provide one of the C{I*Factory}
interfaces below; L{authsrv.testing} holds the conformance suites its
implementation must pass.

Store and identity methods return L{Deferred}s, so that backends doing
network I/O (PostgreSQL, LDAP) and thread-pool work (SQLite, argon2) share one
shape. Times are integer seconds since the epoch, given by the caller.
"""

from __future__ import annotations

from twisted.cred.checkers import ICredentialsChecker
from twisted.plugin import IPlugin
from zope.interface import Attribute, Interface

# --- plugin factories -------------------------------------------------------


class IPluginContext(Interface):
    """
    What the server lends a plugin while it builds its object.
    """

    reactor = Attribute("The reactor (IReactorTime, IReactorThreads, ...).")
    base_dir = Attribute(
        "pathlib.Path against which relative paths in the config are resolved."
    )
    check_only = Attribute(
        "True when the operator command only checks a config: the factory"
        " validates its section (reading what exists, if it likes) without"
        " creating or changing anything, and returns None."
    )
    max_token_lifetime = Attribute(
        "Seconds the longest-lived signed token stays valid: how long a"
        " retired signing key must stay published."
    )
    session_lifetime = Attribute(
        "Seconds a browser session lasts (C{[limits] session_ttl}): how long"
        " after it stops signing a key must still verify the id_token_hints"
        " it signed, unpublished."
    )
    password_hasher = Attribute(
        "The argon2 PasswordHasher of the config's [passwords] parameters:"
        " new hashes are made with it, and a stored hash of other parameters"
        " is replaced on its user's next successful login."
    )
    link_provider = Attribute(
        "The configured chat platform's name (C{[chat] provider}), as linked"
        " accounts record it; None when the config has no [chat] section."
    )
    store_observer = Attribute(
        "None, or the observer a store reports each call to, as"
        " C{observer(label, seconds, failed)} (L{authsrv.store.observer})."
    )

    def threadpool(name, size):
        """
        A bounded L{ThreadPool} owned, started and stopped by the server, for
        blocking work that must stay off the reactor thread.
        """


class _IFactory(IPlugin):
    name = Attribute("The name that selects this plugin in the config file.")
    description = Attribute("One line saying what the plugin provides.")

    def from_config(section, context):
        """
        Validate C{section} (a L{authsrv.configsection.Section} of the plugin's
        own keys) and build the object, or raise
        L{authsrv.configsection.ConfigError} naming the bad key.

        @param context: an L{IPluginContext}.
        """


class IIdentityBackendFactory(_IFactory):
    """Builds an L{IIdentityBackend}."""


class IStoreFactory(_IFactory):
    """Builds an L{IStore}."""


DROPPED_ALGORITHM_SETTLES = 86400
"""How long a key of an algorithm dropped from a keystore's config may go on being active (L{IKeystoreFactory})."""


class IKeystoreFactory(_IFactory):
    """
    Builds an L{IKeystore}. Its section's C{algorithms} (RS256 alone when
    absent) must be what the keystore signs with: the config checks the
    algorithms clients choose against that same key. Keys of an algorithm no
    longer listed are retired as a rotation retires a key, not kept, once
    the active one has signed for L{DROPPED_ALGORITHM_SETTLES} seconds:
    other instances sharing the keys may still list it for a while (a
    rolling deploy) and would make it new keys at once.
    """


# --- identity ---------------------------------------------------------------


class IUser(Interface):
    """
    The avatar interface: a portal login asks for it and gets a
    L{authsrv.records.User}.
    """


class IIdentityBackend(ICredentialsChecker):
    """
    Where users and password checks come from.

    C{requestAvatarId} takes L{twisted.cred.credentials.IUsernamePassword} and
    fires with the user's C{sub} (a C{str}), or fails with
    L{authsrv.identity.errors.UnknownUser} (no such login: a chain may try the
    next backend), L{twisted.cred.error.UnauthorizedLogin} (wrong password:
    stop) or L{authsrv.identity.errors.BackendUnavailable} (try later; never
    reported to the user as a wrong password).
    """

    def user_by_id(sub):
        """Fires with the L{authsrv.records.User} for C{sub}, or L{None}."""

    def user_by_login(login):
        """Fires with the L{authsrv.records.User} for a login name, or L{None}."""

    def close():
        """Release resources; fires when done."""


class IUserManagement(Interface):
    """
    An identity backend that can write its users (the static users file,
    PostgreSQL in mode "own"), as the operator command and a later admin API
    do. Logins are matched as the backend matches them at login
    (case-insensitively). Each method returns an awaitable; a bad field, a
    login or sub already taken, or an unknown login fails with L{ValueError},
    whose text is for the operator.
    """

    users_location = Attribute(
        "Where the users are written, as the operator reads it: a file's path, or"
        " 'the PostgreSQL identity backend'."
    )

    def add_user(user, password_hash):
        """Add the L{authsrv.records.User} with an argon2id hash; fires with it."""

    def set_password_hash(login, password_hash):
        """Replace a user's password hash with another argon2id hash."""

    def set_disabled(login, disabled, reason=None):
        """Disable a user (C{reason} is reported as the ban reason) or enable one."""

    def remove_user(login):
        """Remove a user and their password hash."""

    def list_users():
        """Fires with every L{authsrv.records.User}, ordered by login."""


class IChatLinkSource(Interface):
    """
    An identity backend that also holds users' chat-platform links with
    their provider tokens in plain form (a Better Auth database's
    C{account} rows), so chat-token serves them beside the links the link
    flow stores; a link in the store wins. Each method returns an awaitable.
    """

    def chat_link(sub, provider):
        """
        Fires with the user's L{authsrv.records.SourceChatLink} at
        C{provider}, or None.
        """

    def save_chat_tokens(link_id, version, access_token, refresh_token, scope, expires_at):
        """
        Compare-and-swap refreshed tokens into the link: fires True when its
        C{version} still matched. C{refresh_token} None keeps the stored one.
        """


# --- store roles ------------------------------------------------------------


class IClientRegistry(Interface):
    def add_client(client):
        """
        Insert a new L{authsrv.records.Client}; fails with
        L{authsrv.store.errors.AlreadyExists} if the id is taken.
        """

    def put_client(client):
        """Insert or replace a client (config-declared clients use this)."""

    def change_client(before, after):
        """
        Replace the stored client C{before} with C{after} (the same
        client_id) only while the stored record is still C{before}; fires
        True, or False with nothing written when it changed or is gone
        since it was read. An operator's change made from what it read
        then neither undoes a change made in the meantime (a secret
        rotated) nor brings back a removed client.
        """

    def get_client(client_id):
        """Fires with the L{authsrv.records.Client} or L{None}."""

    def list_clients(after=None, limit=None):
        """
        Fires with the clients ordered by client_id (by code point): only
        those after C{after}, at most C{limit}, when given. The admin API
        pages with them, read by the index, never every client per page.
        """

    def list_clients_of(sources):
        """
        Fires with the stored clients whose source is one of C{sources},
        ordered by client_id: registration checks names against the
        operator's few clients by it, read by an index, never every client.
        """

    def count_clients(source):
        """
        Fires with how many stored clients have C{source}: registration
        checks its cap with it at every request, so it reads an index,
        never every client.
        """

    def remove_client(client_id, expected=None):
        """
        Remove a client with its grants (so every code and token issued to it)
        and its consents, in one transaction; fires with True when it existed.
        A removed client's tokens must stop working at once, not at expiry,
        and it must start no grant afterwards, even from a store call that
        ran beside the removal: every call that starts a grant stores it only
        while its client is stored (L{IAuthorizationCodeStore.save_code}).
        With C{expected} (a client as read), only while the stored record is
        still it, as L{change_client} compares: False, with nothing removed,
        when it changed since.
        """


class IBrowserSessionStore(Interface):
    def create_session(session):
        """Store a new L{authsrv.records.BrowserSession}."""

    def get_session(session_hash, now):
        """Fires with the session if it exists and has not expired, else None."""

    def end_session(session_hash):
        """Delete a session; fires with the ended session or None."""

    def end_user_sessions(sub):
        """Delete every session of a user; fires with the ended sessions (for back-channel logout)."""

    def list_user_sessions(sub, now, after=None, limit=None):
        """
        Fires with the user's sessions unexpired at C{now}, oldest first (by
        created_at, then sid by code point): only those after C{after}, a
        C{(created_at, sid)} pair, at most C{limit}, when given. The admin
        API pages with them, read by an index of sessions by user in that
        order. The key is the public sid, never the session_hash, which
        stands for the cookie; a sid is random and a replaced session's
        successor takes it only once the first has ended, so the pair is
        one session's.
        """

    def touch_session(session_hash, now):
        """Record that a request used the session at C{now} (its C{last_seen})."""


class IInteractionStore(Interface):
    def save_interaction(interaction):
        """Store a new L{authsrv.records.Interaction}."""

    def save_login_interaction(interaction, cap):
        """
        Store a new login-stage interaction unless its C{address} already has
        C{cap} live ones (expiring after its C{created_at}), decided at once
        across instances so racing requests never pass the cap. Fires with
        None once stored, else with the time the address falls below the
        cap (nothing stored).
        """

    def get_interaction(interaction_id, now):
        """Fires with the interaction if it has not expired, else None."""

    def take_interaction(interaction_id, stage):
        """
        Delete the interaction if it is at C{stage}; fires with True for
        exactly one of two racing submissions, False for the rest.
        """


class ILinkAttemptStore(Interface):
    def save_link_attempt(attempt):
        """Store a new L{authsrv.records.LinkAttempt}."""

    def take_link_attempt(state_hash, session_hash, now):
        """
        Delete and fire with the unexpired attempt of that state started in
        the session C{session_hash}, so it works once; else None (an attempt
        of another session is left alone).
        """


class IPushedRequestStore(Interface):
    """Authorization requests pushed by clients (RFC 9126), each usable once."""

    def save_pushed_request(pushed):
        """Store a new L{authsrv.records.PushedRequest}."""

    def take_pushed_request(uri_hash, client_id, now):
        """
        Delete and fire with the unexpired pushed request of that
        C{request_uri} hash pushed by C{client_id}, so it is used once:
        exactly one of racing takes gets it; else None. One pushed by
        another client is left alone.
        """


class IAuthorizationCodeStore(Interface):
    def save_code(code, grant, stored_client=True):
        """
        Store a code together with the (new) grant it will start, in one
        transaction, so that a replayed code can revoke that grant even while
        its first redemption is still issuing tokens. Fires True when stored;
        False, storing nothing, when the grant's client is not stored (it
        was removed while an instance still held it in its cache), unless
        C{stored_client} is false: a client described by its metadata
        document is never stored (L{authsrv.records.Client.stored}). (The
        flows take None, what a store written before this answer fires, as
        stored.)
        """

    def find_code(code_hash, now, link_provider=None):
        """
        Look a code up, changing nothing. Fires with
        L{authsrv.store.codes.CodeFound} (unused, unexpired, its grant live:
        with that grant, its user's ban and C{linked_user_id} as for
        L{IGrantStore.find_access_token}, read in the same round trip),
        L{authsrv.store.codes.CodeReused} (used before; the caller revokes
        its grant) or L{authsrv.store.codes.CodeNotFound}.
        """

    def redeem_code(code_hash, access, refresh, now):
        """
        In one transaction: mark the code used if it is still unused,
        unexpired and its grant live, and store the
        L{authsrv.records.AccessToken} and the optional
        L{authsrv.records.RefreshToken} issued for it. Fires with
        L{authsrv.store.codes.CodeRedeemed}, L{authsrv.store.codes.CodeReused}
        (a racing redemption won: the grant is revoked as part of the same
        step, nothing stored) or L{authsrv.store.codes.CodeNotFound}.
        """

    def refuse_code(code_hash, now):
        """
        Use the code up and revoke its grant, in one transaction: a request
        that presented it failed a check. Fires with None.
        """


class IGrantStore(Interface):
    def get_grant(grant_id):
        """Fires with the L{authsrv.records.Grant} or None."""

    def issue_tokens(access, refresh):
        """
        Store an L{authsrv.records.AccessToken} and an optional
        L{authsrv.records.RefreshToken} of an existing grant in one transaction.
        """

    def start_grant(grant, access):
        """
        Store a new grant with its one access token, in one transaction: a
        client's grant for itself (client_credentials), which has no code.
        Fires True when stored; False, storing nothing, when the grant's
        client is not stored (as for L{IAuthorizationCodeStore.save_code}).
        """

    def find_access_token(token_hash, now, link_provider=None):
        """
        Fires with the L{authsrv.records.AccessToken} if it is active (known,
        unexpired, neither it nor its grant revoked), else None; its
        C{user_ban} is the user's ban record, if any (in force or not). With
        a C{link_provider} (the configured chat platform), its
        C{linked_user_id} is the C{provider_user_id} of the user's linked
        account at that provider, or None when there is none; without, it is
        L{authsrv.records.NOT_READ} and nothing more is read. One indexed
        lookup: this is the introspection and UserInfo hot path.
        """

    def get_refresh_token(token_hash, link_provider=None):
        """
        Fires with the L{authsrv.records.RefreshToken} in whatever state it is
        (C{revoked} set when it or its grant is revoked), with C{user_ban} and
        C{linked_user_id} as for L{find_access_token} and its C{grant}, all in
        one round trip, or None.
        """

    def rotate_refresh(old_hash, new_refresh, new_access, replay, grace_until, now):
        """
        The one compare-and-swap of refresh rotation. Fires with
        L{authsrv.records.Rotated} (old token was active: it is now consumed,
        carries C{replay} until C{grace_until}, and the new tokens are
        stored), L{authsrv.records.Replayed} (consumed before, still inside
        its grace window: here is the stored replay; never when C{replay}
        was None, as without a grace window),
        L{authsrv.records.Reused} (consumed before the window: the whole
        grant is revoked in the same transaction) or
        L{authsrv.records.RefreshNotFound}.
        """

    def revoke_token(token_hash, client_id, now):
        """
        RFC 7009 for a token of C{client_id}: a refresh token revokes its
        grant (L{authsrv.records.RevokedRefresh}), an access token only itself
        (L{authsrv.records.RevokedAccess}); a token of another client, or an
        unknown one, revokes nothing (L{authsrv.records.NotRevoked}).
        """

    def revoke_grant(grant_id, now):
        """Revoke a grant and so every token issued from it; fires True if it was live."""

    def revoke_user_grants(sub, now):
        """Revoke every live grant of a user; fires with how many."""

    def list_user_grants(sub, now, after=None, limit=None):
        """
        Fires with the user's grants neither revoked nor expired at C{now},
        oldest first (by created_at, then grant_id by code point): only
        those after C{after}, a C{(created_at, grant_id)} pair, at most
        C{limit}, when given. The admin API pages with them, read by an
        index of grants by user in that order, never every grant of the user
        per page.
        """

    def access_state(sub, now):
        """
        Fires with an L{authsrv.records.AccessState}: the user's ban in force
        at C{now} (or None), and whether a non-revoked, unexpired access or
        refresh token of the user exists (the user-access C{hasActiveGrant}).
        """

    def session_clients(sid):
        """
        Fires with the sorted ids of the clients holding a grant from the
        browser session C{sid}, revoked or not: who gets a back-channel
        logout when that session ends.
        """

    def save_consent(sub, client_id, scope, now, stored_client=True):
        """
        Add C{scope} to what the user consented to for the client (a new
        consent of just C{scope} when there is none), dated C{now}, in one
        atomic step: a revoke that lands while a consent is being saved is
        never undone by scopes read before it. Fires with the frozenset of
        scopes the user now consented to; None, saving nothing, when the
        client is not stored (removed meanwhile: a client added again under
        its id asks for consent anew), unless C{stored_client} is false, as
        for L{IAuthorizationCodeStore.save_code}.
        """

    def get_consent(sub, client_id):
        """Fires with the frozenset of consented scopes, or None."""

    def revoke_consent(sub, client_id):
        """Forget a consent; fires True if there was one."""

    def list_user_consents(sub):
        """Fires with the user's L{authsrv.records.Consent}s, ordered by client_id."""


class IBanStore(Interface):
    def ban_user(ban):
        """Store or replace the L{authsrv.records.Ban} of a user."""

    def unban_user(sub):
        """Lift a ban; fires True if there was one."""

    def get_ban(sub, now):
        """Fires with the user's ban in force at C{now}, or None."""

    def list_bans(now, after=None, limit=None):
        """
        Fires with the bans in force at C{now}, ordered by sub (by code
        point): only those after C{after}, at most C{limit}, when given
        (a page, as L{IClientRegistry.list_clients}).
        """


class ILinkedAccountStore(Interface):
    def link_account(account, displacing=None):
        """
        Store a L{authsrv.records.LinkedAccount}, replacing an earlier link of
        the same user and provider; fires with the link it replaced (its
        tokens as they were when it went, for revoking them at the provider,
        as L{unlink_account}) or None. Fails with
        L{authsrv.store.errors.AlreadyLinked}, storing nothing, when that
        provider account (C{provider}, C{provider_user_id}) is linked to
        another user. Two calls racing for one provider account: one wins.
        C{displacing}, a link of that provider account to another user as
        the caller read it (a user no identity backend knows any more), is
        removed in the same transaction when it is still that very link
        (its C{account_id} and C{version}): changed or gone meanwhile, the
        call is as without it. Two callers displacing one link: one wins.
        """

    def get_linked_account(sub, provider):
        """Fires with the user's linked account at that provider, or None."""

    def linked_sub(provider, provider_user_id):
        """Fires with the sub of the user that provider account is linked to, or None."""

    def unlink_account(sub, provider):
        """
        Remove the user's link at that provider; fires with the removed
        L{authsrv.records.LinkedAccount} (its tokens as they were when it was
        removed, for revoking them at the provider), or None when there was
        none.
        """

    def update_linked_tokens(
        account_id, expected_version, access_token_enc, refresh_token_enc, scope,
        expires_at, now,
    ):
        """
        Compare-and-swap the provider tokens: fires with the updated
        L{authsrv.records.LinkedAccount} (version + 1) when C{expected_version}
        still matched, else None. A C{refresh_token_enc} of None keeps the
        stored refresh token: a provider that does not rotate it sends none,
        and the one we hold must not be lost.
        """

    def acquire_link_lock(account_id, holder, now, ttl):
        """
        Take the account's refresh lease for C{ttl} seconds if it is free or
        expired; fires True when C{holder} now holds it. Works across
        processes sharing the store.
        """

    def release_link_lock(account_id, holder):
        """Release the lease if C{holder} holds it; fires with None."""


class IDeviceAuthorizationStore(Interface):
    """
    Device authorization requests (RFC 8628), under the hashes of their
    device and user codes; every change of state is one atomic step, so a
    fleet of servers agrees on approvals, polling intervals and redemption.
    """

    def save_device_authorization(device):
        """
        Store a new L{authsrv.records.DeviceAuthorization}; fails with
        L{authsrv.store.errors.AlreadyExists} when either hash is taken.
        """

    def find_device_authorization(user_code_hash, now):
        """Fires with the unexpired device authorization of this user code, or None."""

    def decide_device_authorization(user_code_hash, sub, grant, now):
        """
        A pending, unexpired request approved by C{sub} (C{grant}, stored
        with it) or denied (C{grant} None), atomically: fires True when this
        call decided it, False when it was decided, expired or unknown, or
        its client is no longer stored.
        """

    def poll_device_authorization(device_code_hash, client_id, slow_down, now):
        """
        One poll by C{client_id}, decided atomically and fired as a
        L{authsrv.records.DevicePoll}: a pending request polled sooner than
        its interval after the last poll has its interval raised by
        C{slow_down} seconds; an approved, redeemed (a reuse), denied,
        expired or unknown one (or another client's) changes nothing. An
        approved one is redeemed by L{redeem_device_authorization}.
        """

    def redeem_device_authorization(device_code_hash, access, refresh, now):
        """
        In one transaction: mark the request redeemed if it is still
        approved, unexpired and its grant live, and store the
        L{authsrv.records.AccessToken} and the optional
        L{authsrv.records.RefreshToken} issued for it, so that a failure
        leaves it approved for the next poll. Fires with
        L{authsrv.records.POLL_REDEEMED}, L{authsrv.records.POLL_REUSED} (it
        was redeemed before, by a racing poll: the grant is revoked as part
        of the same step, nothing stored) or L{authsrv.records.POLL_UNKNOWN}
        (expired, its grant revoked, or no such approved request).
        """


class IImportStore(Interface):
    def import_batch(batch):
        """
        Write the records of an L{authsrv.records.ImportBatch} whose key is
        free, all in one transaction (all or nothing); a record whose key is
        taken (its client id, sub, account, consent, grant or token hash, or
        a link's provider account, linked to another user) is left as stored,
        so importing twice writes nothing the second time.
        Fires with a dict: each kind of L{authsrv.records.IMPORT_KINDS} to
        how many were written.
        """


class ILoginThrottle(Interface):
    """
    Login attempts counted in the store, so that every instance sees the
    same numbers and a restart keeps them (docs/design.md, Brute force). An
    attempt is counted before its password is checked, in one atomic step:
    however many requests race, no more passwords are checked than the
    L{authsrv.records.ThrottlePolicy} allows. C{account} is the login name
    as typed, normalised by the caller as the backends compare logins
    (L{authsrv.identity.static.login_key}), known or not, so
    that an unknown name is throttled exactly like a known one.
    """

    def attempt(account, address, device_hash, policy, now):
        """
        Fires with a L{authsrv.records.ThrottleDecision}: either the attempt
        is counted as a failure (until forgiven or succeeded) and may go
        ahead, or it must wait and is not counted. C{device_hash} is the
        hash of the browser's device secret, or None: a device remembered
        for C{account} (L{IKnownDeviceStore}) is not held by the
        account-wide limit. Read in the same step as the counts, so a
        returning browser costs no round trip of its own.
        """

    def forgive(ticket):
        """
        Un-count the attempt of C{ticket} (a correct password for a
        suspended account is no failure); fires True when it was counted.
        """

    def succeeded(account, address, now):
        """
        A correct password: clear the attempts of this (account, address)
        pair, the one just counted included; other pairs keep theirs.
        """


class IKnownDeviceStore(Interface):
    """
    Browsers that signed in to an account before (OWASP device cookies),
    shared by every instance; only the hash of a cookie's random value is
    stored.
    """

    def remember_device(account, device_hash, expires_at):
        """
        Remember (or keep longer) a device of the account, by the same
        C{account} key as the throttle, which reads it (L{ILoginThrottle.attempt}).
        """


class IProofReplayStore(Interface):
    """
    Proofs already seen (DPoP jti, RFC 9449 section 11.1; passkey
    challenges answered), shared by every instance so that a proof replayed
    to another one is refused too.
    """

    def first_use(replay_key, expires_at, now):
        """
        Fires True when C{replay_key} was not seen before (or what was seen
        expired by C{now}) and records it until C{expires_at}, atomically: of
        two racing uses exactly one gets True.
        """


class IFactorStore(Interface):
    """
    Users' second factors, in authsrv's own store under the user's stable
    id (C{sub}), whatever identity backend knows the user. Secrets arrive
    sealed and codes hashed by the caller; the store never sees either.
    """

    def enrol_totp(sub, secret_enc, step, now):
        """
        Keep the user's confirmed TOTP secret, replacing any earlier one;
        C{step} is the time step of the code that confirmed it, which is
        thereby used.
        """

    def get_totp(sub):
        """Fires with the user's L{authsrv.records.TotpFactor}, or None."""

    def use_totp_step(sub, step):
        """
        Accept a code of time step C{step}, atomically: fires True when it
        is later than every step accepted before (and records it), False
        for a replay, an older step or no TOTP factor.
        """

    def replace_recovery_codes(sub, code_hashes, now):
        """Keep C{code_hashes} as the user's recovery codes, dropping any earlier set."""

    def use_recovery_code(sub, code_hash):
        """Use one recovery code up, atomically: fires True for exactly one of racing uses."""

    def list_factors(sub):
        """Fires with the user's L{authsrv.records.Factor}s, TOTP first."""

    def reset_factors(sub):
        """
        Remove every factor of the user (passkeys included) and the start
        of their grace period; fires True when any was kept.
        """

    def add_passkey(passkey):
        """
        Keep a new L{authsrv.records.Passkey}; fails with
        L{authsrv.store.errors.AlreadyExists} when its credential id is known.
        """

    def get_passkey(credential_id):
        """Fires with the L{authsrv.records.Passkey} of that credential id, or None."""

    def list_passkeys(sub):
        """Fires with the user's passkeys, oldest first."""

    def use_passkey(credential_id, sign_count, backup_state, now):
        """
        Accept an assertion signed at counter C{sign_count}, atomically:
        fires True when it is above the stored counter (or both are zero,
        for authenticators without one), recording it with C{backup_state}
        and C{now} as last used; False for a counter that did not grow
        (a cloned authenticator) or an unknown credential.
        """

    def remove_passkey(sub, credential_id):
        """Remove one of the user's passkeys; fires True when it was there."""

    def mfa_demanded(sub, now):
        """
        Fires with when a policy first asked the user to enrol a second
        factor, recording C{now} if never (the grace period runs from then).
        """


SERVER_KEY_BYTES = 32


class IServerSecrets(Interface):
    """
    Random keys of the server itself, the same for every instance sharing
    the store and kept across restarts, so that no operator has to make,
    copy or keep them.
    """

    def server_key(name):
        """
        Fires with the 32-byte key called C{name}: made at random and stored
        on first use, atomically (of two instances racing, both get the key
        that was stored first), and the same one every time after.
        """


class IClientAssertionStore(Interface):
    def claim_jti(client_id, jti, expires_at, now):
        """
        Record that C{client_id} used an assertion with C{jti}, kept until
        C{expires_at}; fires True for its first use, False when it is
        recorded and unexpired at C{now} (a replay), decided at once across
        instances so that of two racing uses exactly one succeeds.
        """


class IStore(
    IServerSecrets,
    IClientRegistry,
    IBrowserSessionStore,
    IInteractionStore,
    ILinkAttemptStore,
    IPushedRequestStore,
    IAuthorizationCodeStore,
    IDeviceAuthorizationStore,
    IGrantStore,
    IBanStore,
    ILinkedAccountStore,
    ILoginThrottle,
    IKnownDeviceStore,
    IFactorStore,
    IImportStore,
    IClientAssertionStore,
    IProofReplayStore,
):
    """
    Every role in one backend object; flows depend only on the roles they use.
    """

    def ping():
        """Fires when the store answers a trivial query (readiness)."""

    def gc(now, batch_size):
        """
        Delete up to C{batch_size} rows of each kind that can no longer matter
        (expired codes, device requests, pending and pushed requests, sessions, tokens, grants, bans,
        counted login attempts, known devices, seen proofs) and
        erase replay responses past their grace window; fires with the count.
        """

    def close():
        """Release connections and threads; fires when done."""


# --- keys -------------------------------------------------------------------


class IKeystore(Interface):
    """
    Signing keys. Private keys never leave the keystore: callers get
    signatures and public key sets.
    """

    algorithms = Attribute("Tuple of the JWS algorithms it can sign with.")

    def sign(claims, alg="RS256", typ="JWT"):
        """
        Sign C{claims} (a dict) with the active key of C{alg}; returns the
        compact JWS as C{str}, its header carrying C{kid}, C{alg} and C{typ}.
        """

    def jwks_bytes():
        """
        The public JWK set (next, active and retired keys, no private
        member), serialized once per change: C{bytes} ready to serve.
        """

    def public_keyset():
        """The same key set as a L{jwcrypto.jwk.JWKSet}, for verification."""

    def hint_key(kid):
        """
        The public L{jwcrypto.jwk.JWK} (its C{alg} set) of key C{kid} for
        verifying an C{id_token_hint}, or L{None}: a published key, or one
        that stopped signing less than the context's C{session_lifetime}
        ago, since relying parties keep the ID token for their whole
        session. Those no longer published are never published again and
        never sign. Answered from memory: it is on the request path.
        """

    def keys():
        """A list of L{authsrv.records.KeyInfo} for every published key."""

    def rotate(now, actor="operator"):
        """
        Promote each algorithm's next key to active, retire the active one
        (kept published until C{now} plus the retention), generate a new next
        key, unpublish retired keys whose retention has passed; fires with an
        L{authsrv.records.Rotation}: the new keys, and whether this call
        rotated them or adopted the rotation another process had just made
        (its keys no longer the stored ones), which it must not repeat. The
        audit event names C{actor}.
        """

    def reload():
        """
        Pick up changes another process (the operator command, another
        instance) made to the keys; fires True when something changed.
        """

    def maintain(now):
        """
        Called by the server about once a minute: L{reload}, then rotate when
        the configured schedule says the active key is due, retire the keys
        of dropped algorithms (L{IKeystoreFactory}), and unpublish retired
        keys whose retention has passed; fires when done.
        """


# --- chat platform ----------------------------------------------------------


class IChatProvider(Interface):
    """
    The OAuth 2 client of one chat platform: the link flow sends the browser
    to its authorize URL and redeems the code it brings back; the chat-token
    endpoint refreshes the stored token through it. Its network calls
    return awaitables (coroutines or L{Deferred}s).

    Every call is bounded in time as a whole and in the size of the answer it
    reads. A platform that cannot be reached, is too slow, answers 5xx or 429,
    or answers something other than the OAuth JSON object it should, fails the
    call with L{authsrv.chat.errors.ChatProviderUnavailable}: nothing was
    decided, the caller keeps what it holds and may try again. Tokens are
    never logged. L{authsrv.testing.chat} holds the conformance suite.
    """

    name = Attribute("The provider's name, under which linked accounts are stored (C{str}).")

    def authorize_url(state, code_challenge, redirect_uri):
        """
        The URL the browser is sent to for the user's approval: the
        configured authorize endpoint, its own query kept, with the
        authorization-code request added (client id, scopes, C{state},
        C{redirect_uri}, and the PKCE S256 C{code_challenge} unless it is
        None).
        """

    def exchange_code(code, code_verifier, redirect_uri):
        """
        Redeem the code the browser came back with (C{code_verifier} None
        when no challenge was sent); fires with an
        L{authsrv.chat.provider.ProviderTokens}, or fails with
        L{authsrv.chat.provider.ChatCodeRejected} when the provider refuses
        the code (unknown, used, expired, wrong verifier or redirect URI: the
        user starts again), or with C{ChatProviderUnavailable}.
        """

    def refresh(refresh_token):
        """
        Fires with new L{authsrv.chat.provider.ProviderTokens}: their
        C{refresh_token} is None when the provider did not rotate it (the
        caller keeps the one it holds) and their C{scope} None when the answer
        named none (unchanged). Fails with
        L{authsrv.chat.errors.ChatRefreshRefused} when the provider refuses
        the refresh token (invalid_grant: the user must link again), or with
        C{ChatProviderUnavailable}.
        """

    def current_user(access_token):
        """
        Fires with the provider's id (C{str}) of the user the access token
        belongs to; any answer without one, a refused token included, is
        C{ChatProviderUnavailable}.
        """

    def revoke(token, token_type_hint):
        """
        Revoke a token this client was given (RFC 7009; C{token_type_hint}
        "access_token" or "refresh_token") at the provider's revocation
        endpoint; fires with None, at once when none is configured. A refusal
        or failure is C{ChatProviderUnavailable}.
        """
