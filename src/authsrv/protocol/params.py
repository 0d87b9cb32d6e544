"""
Reading OAuth parameters from a query string or a form body.

RFC 6749 section 3.1: parameters sent without a value are treated as
omitted, and request parameters must not be included more than once.
"""

from __future__ import annotations

from authsrv.protocol.errors import InvalidRequest, InvalidTarget

MAX_PARAM_LENGTH = 8192


class ParamError(InvalidRequest):
    """
    L{InvalidRequest} for one parameter; C{problem} says what is wrong with
    it ("is repeated", "is not UTF-8 text", ...), for a caller that words
    its own message (L{single_param}).
    """

    def __init__(self, description: str, problem: str):
        super().__init__(description)
        self.problem = problem


def _repeated(name: str) -> ParamError:
    return ParamError(f"parameter {name} is repeated; send it once", "is repeated")


def single_params(args: dict[bytes, list[bytes]]) -> dict[str, str]:
    """
    C{request.args} as a dict of text, empty values dropped; raises
    L{ParamError} for a repeated parameter, text that is not UTF-8, or a
    value longer than L{MAX_PARAM_LENGTH} or holding a NUL character.
    """
    params: dict[str, str] = {}
    for raw_name, raw_values in args.items():
        try:
            name = raw_name.decode("utf-8")
            values = [v.decode("utf-8") for v in raw_values if v]
        except UnicodeDecodeError:
            raise ParamError("parameters must be UTF-8 text", "is not UTF-8 text") from None
        if len(values) > 1:
            raise _repeated(name)
        if values:
            if len(values[0]) > MAX_PARAM_LENGTH:
                raise ParamError(f"parameter {name} is too long", "is too long")
            if "\x00" in values[0]:
                raise ParamError(f"parameter {name} holds a NUL character", "holds a NUL character")
            params[name] = values[0]
    return params


def single_param(args: dict[bytes, list[bytes]], name: bytes) -> tuple[str | None, str]:
    """
    The parameter C{name} read by the rules of L{single_params}, or None
    and why not ("is missing", "is repeated", ...), for a caller that must
    word its own message (a page, where there is no client to tell).
    """
    try:
        value = single_params({name: args.get(name, [])}).get(name.decode())
    except ParamError as e:
        return None, e.problem
    return (None, "is missing") if value is None else (value, "")


def page_params(args: dict[bytes, list[bytes]]) -> dict[str, str]:
    """
    L{single_params} of a request a person's browser sends, whose refusal a
    page or a client's redirect URI shows: it names no parameter, since the
    name is the request's own text, anyone's through a link.
    """
    try:
        return single_params(args)
    except InvalidRequest:
        raise InvalidRequest("a parameter is repeated, too long, or not UTF-8 text; send each once") from None


def one_resource_params(args: dict[bytes, list[bytes]], several: str) -> dict[str, str]:
    """
    L{single_params} of a request that may name one C{resource}: RFC 8707
    lets a client send several, and a server that cannot serve them
    together answers L{InvalidTarget} (C{several} says what to send), not
    a repeated parameter. The same resource sent twice is that resource.
    """
    resources = args.get(b"resource")
    if resources is None or len(resources) < 2:
        return single_params(args)
    named = {value for value in resources if value}
    if len(named) > 1:
        raise InvalidTarget(f"{len(named)} resources were asked for; {several}")
    return single_params({**args, b"resource": list(named)})


def params_with_token(args: dict[bytes, list[bytes]], *names: bytes, errors: str = "replace") -> dict[str, str]:
    """
    L{single_params}, except for the token called C{name}, which is only
    ever hashed and looked up: one too long, holding a NUL or not UTF-8 text
    is a token that matches nothing, so introspection says inactive (RFC
    7662 section 2.2), revocation says nothing (RFC 7009 section 2.2) and
    UserInfo says invalid_token (RFC 6750 section 3.1), never a 400. A
    well-formed request costs what L{single_params} does. C{names} may be
    several (the sign-in form's login and password); C{errors} is how
    bytes that are not UTF-8 are decoded (L{bytes.decode}).
    """
    try:
        return single_params(args)
    except InvalidRequest:
        if not any(name in args for name in names):
            raise
    params = single_params({key: value for key, value in args.items() if key not in names})
    for name in names:
        sent = [value for value in args.get(name, ()) if value]
        if len(sent) > 1:
            raise _repeated(name.decode())
        if sent:
            params[name.decode()] = sent[0].decode("utf-8", errors)
    return params


def require(params: dict[str, str], name: str) -> str:
    """A required parameter, or L{InvalidRequest} naming it."""
    value = params.get(name)
    if value is None:
        raise InvalidRequest(f"parameter {name} is required")
    return value
