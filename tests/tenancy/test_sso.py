"""Single sign-on: the claim mapping, users matched by issuer and subject, the audit trail of membership
changes, and the pages around OpenID Connect sign-in (the whole flow against a real provider in a real
browser: tests/e2e/test_browser_oidc.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages

from audit.models import AuditEntry
from tenancy import oidc, services, sso
from tenancy.models import Membership, Role, SsoIdentity
from tenancy.permissions import OPERATE_PERM, VIEW_PERM
from tests.support.processes import free_port

ISSUER = "https://id.example.test"
MAP = (("fleet-admins", "acme", "admin"), ("fleet-users", "acme", "member"), ("fleet-users", "globex", "viewer"))


def sign_in(subject: str = "u-1", groups: object = ("fleet-users",), **claims: object):
    return services.sso_sign_in(
        issuer=ISSUER,
        subject=subject,
        claims={
            "sub": subject,
            "preferred_username": "alice",
            "email": "alice@example.test",
            "groups": groups,
            **claims,
        },
        mapping=MAP,
    )


def last_message(response) -> str:
    return str(list(get_messages(response.wsgi_request))[-1])


def roles(user) -> dict[str, str]:
    return {m.workspace.slug: m.role for m in Membership.objects.filter(user=user).select_related("workspace")}


# ---- reading claims ----


@pytest.mark.parametrize(
    ("raw", "values"),
    [(["a", "b"], ["a", "b"]), ("a b,c", ["a", "b", "c"]), (None, []), ([1, None, ""], ["1"]), (7, ["7"])],
)
def test_claim_values_reads_lists_and_strings(raw, values):
    assert sso.claim_values({"groups": raw}, "groups") == values


def test_the_strongest_mapped_role_wins_per_workspace():
    assert sso.workspace_grants(["fleet-users", "fleet-admins"], MAP) == {"acme": Role.ADMIN, "globex": Role.VIEWER}
    assert sso.workspace_grants(["fleet-users"], MAP) == {"acme": Role.MEMBER, "globex": Role.VIEWER}
    assert sso.workspace_grants(["other"], MAP) == {}


def test_username_falls_back_to_email_then_subject():
    assert sso.username_base({"preferred_username": "a b", "sub": "s"}, "preferred_username") == "a-b"
    assert sso.username_base({"email": "bob@x.test", "sub": "s"}, "preferred_username") == "bob"
    assert sso.username_base({"sub": "s-1"}, "preferred_username") == "s-1"


# ---- the service ----


@pytest.mark.django_db
def test_first_sign_in_creates_the_user_with_mapped_memberships_and_audits_them(workspace, other_workspace):
    user = sign_in()
    assert user.username == "alice"
    assert user.email == "alice@example.test"
    assert not user.has_usable_password()
    assert SsoIdentity.objects.get(user=user).subject == "u-1"
    assert roles(user) == {"acme": "member", "globex": "viewer"}
    assert user.has_perm(VIEW_PERM, workspace)
    assert not user.has_perm(OPERATE_PERM, workspace)
    entries = AuditEntry.objects.filter(action="membership.sso_sync").order_by("workspace__slug")
    assert [(e.workspace.slug, e.actor_id, e.detail["role"], e.detail["previous_role"]) for e in entries] == [
        ("acme", user.pk, "member", None),
        ("globex", user.pk, "viewer", None),
    ]


@pytest.mark.django_db
def test_later_sign_ins_follow_the_claims(workspace, other_workspace):
    user = sign_in()
    assert sign_in(groups=["fleet-admins"]).pk == user.pk  # same subject: same user
    assert roles(user) == {"acme": "admin"}  # promoted in acme, removed from globex
    user = get_user_model().objects.get(pk=user.pk)
    assert user.has_perm(OPERATE_PERM, workspace)
    assert not user.has_perm(VIEW_PERM, other_workspace)
    changes = {
        (e.workspace.slug, e.detail["previous_role"], e.detail["role"])
        for e in AuditEntry.objects.filter(action="membership.sso_sync")
    }
    assert {("acme", "member", "admin"), ("globex", "viewer", None)} <= changes
    count = AuditEntry.objects.count()
    sign_in(groups=["fleet-admins"])  # nothing changed: nothing audited
    assert AuditEntry.objects.count() == count
    sign_in(groups=[])
    assert roles(user) == {}


@pytest.mark.django_db
def test_a_membership_set_by_hand_is_never_touched_by_the_mapping(workspace, other_workspace):
    user = sign_in(groups=[])
    services.membership_set(workspace=workspace, user=user, role=Role.OWNER)  # an invitation
    sign_in(groups=["fleet-users"])
    assert roles(user) == {"acme": "owner", "globex": "viewer"}
    sign_in(groups=[])
    assert roles(user) == {"acme": "owner"}


@pytest.mark.django_db
def test_users_are_matched_by_subject_never_by_email_or_name(owner, workspace):
    owner.email = "alice@example.test"
    owner.save()
    user = sign_in(preferred_username="owner")
    assert user.pk != owner.pk
    assert user.username == "owner-2"
    assert roles(owner) == {"acme": "owner"}
    other = sign_in(subject="u-2", preferred_username="owner")
    assert other.pk != user.pk
    assert other.username == "owner-3"


@pytest.mark.django_db
def test_mapped_workspaces_that_do_not_exist_are_skipped(workspace, caplog):
    user = sign_in()
    assert roles(user) == {"acme": "member"}
    assert "globex" in caplog.text


# ---- pages ----

OIDC_ON = {
    "OIDC_ENABLED": True,
    "OIDC_RP_CLIENT_ID": "fleet",
    "OIDC_RP_CLIENT_SECRET": "secret",
    "OIDC_DISPLAY_NAME": "Acme ID",
}


def explicit_endpoints(settings) -> None:
    """OIDC on, with each endpoint configured (no discovery document)."""
    for name, value in OIDC_ON.items():
        setattr(settings, name, value)
    settings.OIDC_DISCOVERY_URL = ""
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = "https://id.example.test/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = "https://id.example.test/token"
    settings.OIDC_OP_USER_ENDPOINT = "https://id.example.test/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = "https://id.example.test/jwks"


@pytest.mark.django_db
def test_without_oidc_the_sign_in_page_is_the_password_form_alone(client):
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with" not in page
    assert 'name="password"' in page
    assert client.get("/accounts/oidc/authenticate/").status_code == 404
    assert client.get("/accounts/oidc/callback/?code=x&state=y").status_code == 404


@pytest.mark.django_db
def test_with_oidc_the_sign_in_page_offers_the_provider_beside_the_password_form(client, settings):
    for name, value in OIDC_ON.items():
        setattr(settings, name, value)
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Acme ID" in page
    assert 'href="/accounts/oidc/authenticate/"' in page
    assert 'name="password"' in page


@pytest.mark.django_db
def test_a_provider_that_does_not_answer_gives_a_message_not_an_error(client, settings):
    for name, value in OIDC_ON.items():
        setattr(settings, name, value)
    settings.OIDC_DISCOVERY_URL = f"http://127.0.0.1:{free_port()}/.well-known/openid-configuration"
    settings.OIDC_TIMEOUT = 2
    response = client.get("/accounts/oidc/authenticate/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/"
    assert "cannot be reached" in last_message(response)


@pytest.mark.django_db
def test_explicit_endpoints_need_no_discovery_and_the_flow_starts_with_state_nonce_and_pkce(client, settings):
    explicit_endpoints(settings)
    response = client.get("/accounts/oidc/authenticate/")
    location = response["Location"]
    assert location.startswith("https://id.example.test/authorize?")
    for part in ("client_id=fleet", "state=", "nonce=", "code_challenge=", "scope=openid+email+profile+groups"):
        assert part in location
    # a callback whose state this session never issued comes back to the sign-in page, explained
    response = client.get("/accounts/oidc/callback/?code=abc&state=forged")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/"
    assert "did not complete" in last_message(response)
    # the provider refusing (the user cancelled) also comes back, with the provider's reason
    response = client.get("/accounts/oidc/callback/?error=access_denied&error_description=End-User+aborted")
    assert response["Location"] == "/accounts/login/"
    assert "End-User aborted" in last_message(response)


@pytest.mark.django_db
def test_the_no_workspace_page_names_the_claim_values(client, workspace):
    user = sign_in(groups=["contractors"])
    client.force_login(user)
    page = client.get("/accounts/oidc/no-workspace/").content.decode()
    assert "No workspace yet" in page
    assert "contractors" in page
    assert "OIDC_WORKSPACE_MAP" in page


@pytest.mark.django_db
def test_sign_out_goes_to_the_provider_only_for_provider_sessions(client, settings, owner):
    explicit_endpoints(settings)
    settings.OIDC_OP_END_SESSION_ENDPOINT = "https://id.example.test/logout"
    client.force_login(owner)
    assert client.post("/accounts/logout/")["Location"] == "/accounts/login/"  # a password session
    client.force_login(owner)
    session = client.session
    session["oidc_id_token"] = "the.id.token"
    session.save()
    location = client.post("/accounts/logout/")["Location"]
    assert location.startswith("https://id.example.test/logout?id_token_hint=the.id.token&client_id=fleet")
    assert "post_logout_redirect_uri=http%3A%2F%2Ftestserver%2Faccounts%2Flogin%2F" in location
    assert client.get("/").status_code == 302  # the session is gone either way


def test_provider_endpoints_explicit_override_and_missing_ones_are_named(settings):
    settings.OIDC_DISCOVERY_URL = ""
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = "https://id.example.test/a"
    settings.OIDC_OP_TOKEN_ENDPOINT = ""
    with pytest.raises(oidc.ProviderUnavailable, match="token_endpoint"):
        oidc.provider_endpoints()


@pytest.mark.django_db
def test_the_admin_lists_identities_and_which_memberships_the_mapping_granted(client, workspace):
    sign_in()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    page = client.get("/admin/tenancy/ssoidentity/").content.decode()
    assert "u-1" in page
    assert client.get("/admin/tenancy/ssoidentity/add/").status_code == 403
    assert client.get("/admin/tenancy/membership/?granted_by_sso__exact=1").content.decode().count("alice") >= 1
