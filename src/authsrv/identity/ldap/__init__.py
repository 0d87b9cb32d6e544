"""
The LDAP identity backend: users from an enterprise directory (OpenLDAP,
Active Directory, anything speaking LDAPv3), on ldap3. L{config} reads the
section, L{directory} holds the connections, L{backend} is the
L{IIdentityBackend}.

A login is a search, then a bind (ldaptor's LDAPBindingChecker, Dex's LDAP
connector): the service account (or an anonymous search) finds the one
entry the configured filter matches, and a bind as that entry checks the
password, so no password hash ever leaves the directory. A login the search
does not find still costs a bind, as a DN no entry has, so that timing does
not tell unknown logins from wrong passwords. Every value a user typed is
escaped before it enters a filter.

ldap3 blocks, so every directory operation runs on the server's bounded
C{ldap} thread pool, on a connection that one thread uses at a time
(password checks bind on connections kept for nothing else); a
pooled connection the directory dropped (a restart, an idle timeout) is
replaced and the operation tried once more, and an unreachable, refusing or
hung directory is L{BackendUnavailable} within the configured timeouts,
never a wrong password.

The directory is asked again on every L{backend.LdapIdentityBackend.user_by_id},
which the server does on refresh, user-access, UserInfo and introspection
through the chain's standing cache (L{authsrv.identity.cache}, 30 s by
default): a user disabled there, removed, or no longer in the required
groups loses access within that time.
"""
