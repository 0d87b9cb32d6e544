"""RFC 9728 documents, their well-known URL and the challenge, as docs/resource-servers.md shows them."""

import pytest

from authsrv.protocol.resource_metadata import bearer_challenge, metadata_url, protected_resource_metadata

ISSUER = "https://id.example.com/api/auth"


def test_the_document_names_authsrv_as_the_authorization_server():
    assert protected_resource_metadata("https://tools.example.com/mcp", ISSUER, scopes=["openid", "tools"],
                                       resource_name="Company tools") == {
        "resource": "https://tools.example.com/mcp",
        "authorization_servers": [ISSUER],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["openid", "tools"],
        "resource_name": "Company tools",
    }


@pytest.mark.parametrize("resource", ["http://tools.example.com/", "https://tools.example.com/?a=1",
                                      "https://tools.example.com/#f", "https:///path"])
def test_a_resource_must_be_a_plain_https_url(resource):
    with pytest.raises(ValueError):
        protected_resource_metadata(resource, ISSUER)


@pytest.mark.parametrize(("resource", "url"), [
    ("https://tools.example.com", "https://tools.example.com/.well-known/oauth-protected-resource"),
    ("https://tools.example.com/", "https://tools.example.com/.well-known/oauth-protected-resource"),
    ("https://tools.example.com:8443/mcp", "https://tools.example.com:8443/.well-known/oauth-protected-resource/mcp"),
])
def test_the_well_known_url_goes_before_the_path(resource, url):
    assert metadata_url(resource) == url


def test_the_challenge_points_at_the_metadata():
    assert bearer_challenge("https://tools.example.com/mcp", "invalid_token") == (
        'Bearer resource_metadata="https://tools.example.com/.well-known/oauth-protected-resource/mcp",'
        ' error="invalid_token"')
