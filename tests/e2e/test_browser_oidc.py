"""Single sign-on in a real browser against a real OpenID Connect provider running as a second process
(panva's oidc-provider, tests/support/oidc_provider.py): Chromium clicks "Sign in with Test ID", signs in
and consents at the provider, and lands on the dashboard of the workspace its `groups` claim maps to; the
first sign-in created the user with that membership (and its audit entry); sign-out ends the session
here and at the provider (RP-initiated logout) and comes back to the sign-in page; a user whose groups
map to no workspace gets the page that says so; the local admin still signs in with a password.
Screenshots go to test-output/screenshots/oidc-*.png.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEntry
from tenancy import services as tenancy
from tenancy.models import Membership, SsoIdentity
from tests.support.browser import chromium, needs_chromium, watched_page
from tests.support.live import ControlPlane, subprocess_env
from tests.support.oidc_provider import OidcProvider, provider_modules
from tests.support.processes import REPO_ROOT, free_port

SHOTS = REPO_ROOT / "test-output" / "screenshots"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    needs_chromium,
    pytest.mark.skipif(not provider_modules(), reason="oidc-provider is not installed (bash .ci/oidc-provider)"),
]

ACCOUNTS = {
    "alice": {
        "email": "alice@example.test",
        "email_verified": True,
        "preferred_username": "alice",
        "given_name": "Alice",
        "family_name": "Liddell",
        "groups": ["fleet-admins", "staff"],
    },
    "bob": {"email": "bob@example.test", "preferred_username": "bob", "groups": ["contractors"]},
}


@pytest.fixture
def stack(tmp_path):
    """The provider, then one web replica configured for it (the control plane's port is chosen first:
    the provider must know the client's redirect URIs)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    provider = OidcProvider(
        tmp_path,
        clients=[
            {
                "client_id": "fleet",
                "client_secret": "fleet-test-secret",
                "redirect_uris": [f"{base}/accounts/oidc/callback/"],
                "post_logout_redirect_uris": [f"{base}/accounts/login/"],
            }
        ],
        accounts=ACCOUNTS,
    )
    env = subprocess_env(
        OIDC_CLIENT_ID="fleet",
        OIDC_CLIENT_SECRET="fleet-test-secret",
        OIDC_ISSUER=provider.issuer,
        OIDC_DISPLAY_NAME="Test ID",
        OIDC_WORKSPACE_MAP="fleet-admins=acme:admin,fleet-users=acme:member",
    )
    plane = ControlPlane(log_dir=tmp_path, env=env)
    try:
        plane.start_replica(port)
        yield plane, provider
    finally:
        plane.stop()
        provider.stop()


@pytest.fixture
def browser_page():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        yield watched_page(browser.new_context(viewport={"width": 1280, "height": 900}), console=False)


def _shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"oidc-{name}.png"), full_page=True)


def _provider_sign_in(page, provider: OidcProvider, login: str) -> None:
    """At the provider: its development login form, then its consent screen."""
    page.wait_for_url(re.compile(rf"^{re.escape(provider.issuer)}/interaction/"))
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password: the dev interactions do not check it")
    _shot(page, f"{login}-provider-login")
    page.click("button[type=submit]")
    page.wait_for_selector("input[name=prompt][value=consent]", state="attached")
    _shot(page, f"{login}-provider-consent")
    page.click("button[type=submit]")


def _sign_out_everywhere(page, provider: OidcProvider, base: str) -> None:
    page.click(".signout button[type=submit]")
    page.wait_for_url(re.compile(rf"^{re.escape(provider.issuer)}/session/end"))
    _shot(page, "provider-logout")
    page.click("button[name=logout][value=yes]")
    page.wait_for_url(f"{base}/accounts/login/")


def test_single_sign_on_in_a_real_browser(stack, browser_page):
    plane, provider = stack
    page, errors = browser_page
    base = plane.url
    admin = get_user_model().objects.create_superuser("admin", password="admin")
    acme = tenancy.workspace_create(name="Acme", owner=admin)
    tenancy.workspace_create(name="Globex", owner=admin)

    # the sign-in page offers the provider beside the password form
    page.goto(f"{base}/accounts/login/")
    _shot(page, "login")
    assert page.locator("input[name=password]").count() == 1
    page.click("text=Sign in with Test ID")

    # first sign-in: the user is created and lands on the dashboard of the workspace its groups map to
    _provider_sign_in(page, provider, "alice")
    page.wait_for_url(f"{base}/")
    _shot(page, "alice-dashboard")
    assert page.locator(".signout .who").inner_text() == "alice"
    assert "Acme" in page.content()
    assert "Globex" not in page.content()
    alice = get_user_model().objects.get(username="alice")
    assert (alice.email, alice.first_name, alice.has_usable_password()) == ("alice@example.test", "Alice", False)
    identity = SsoIdentity.objects.get(user=alice)
    assert (identity.issuer, identity.subject) == (provider.issuer, "alice")
    membership = Membership.objects.get(user=alice)
    assert (membership.workspace_id, membership.role, membership.granted_by_sso) == (acme.pk, "admin", True)
    entry = AuditEntry.objects.get(action="membership.sso_sync", actor=alice)
    assert (entry.workspace_id, entry.detail["role"]) == (acme.pk, "admin")
    # the mapped Admin role is what the pages enforce: Acme's compute clusters are open to alice
    assert page.goto(f"{base}/compute/").status == 200

    # sign-out ends the session here and, confirmed at the provider, there; back to the sign-in page
    page.goto(f"{base}/")
    _sign_out_everywhere(page, provider, base)
    page.goto(f"{base}/")
    page.wait_for_url(f"{base}/accounts/login/?next=/")
    # the provider asks for a login again: its session ended too
    page.click("text=Sign in with Test ID")
    page.wait_for_selector("input[name=login]")
    page.goto(f"{base}/accounts/login/")

    # a user whose groups map to no workspace: signed in, told why, not an error
    page.click("text=Sign in with Test ID")
    _provider_sign_in(page, provider, "bob")
    page.wait_for_url(f"{base}/accounts/oidc/no-workspace/")
    _shot(page, "bob-no-workspace")
    assert "No workspace yet" in page.content()
    assert "contractors" in page.content()
    assert not Membership.objects.filter(user__username="bob").exists()
    _sign_out_everywhere(page, provider, base)

    # the local admin still signs in with a password
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin")
    page.click("form[action='/accounts/login/'] button[type=submit]")
    page.wait_for_url(f"{base}/")
    assert page.locator(".signout .who").inner_text() == "admin"
    _shot(page, "admin-dashboard")
    page.click(".signout button[type=submit]")  # a password session: no provider round trip
    page.wait_for_url(f"{base}/accounts/login/")

    ours = [e for e in errors if base in e or not e[:3].isdigit()]
    assert ours == [], ours
    assert "Traceback" not in plane.logs()
