// A real OpenID Connect provider for the sign-in tests: panva's oidc-provider (certified), configured
// with its documented options only. Nothing here implements OIDC.
//
//   node provider.mjs  (environment:)
//     OIDC_PROVIDER_MODULES  the folder holding node_modules/ (.ci/oidc-provider prints it)
//     OIDC_PROVIDER_PORT     port on 127.0.0.1; the issuer is http://127.0.0.1:<port>
//     OIDC_PROVIDER_CONFIG   JSON: {"clients": [client metadata...], "accounts": {"<login>": {claims}}}
//
// Sign-in uses the provider's development interactions (a login form taking the account name; the
// password is not checked) and its consent screen; RP-initiated logout asks "Do you want to sign-out".
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const modules = process.env.OIDC_PROVIDER_MODULES;
const port = Number(process.env.OIDC_PROVIDER_PORT);
const config = JSON.parse(process.env.OIDC_PROVIDER_CONFIG);
const { default: Provider } = await import(
  pathToFileURL(join(modules, 'node_modules', 'oidc-provider', 'lib', 'index.js')).href
);

const issuer = `http://127.0.0.1:${port}`;
const provider = new Provider(issuer, {
  clients: config.clients,
  async findAccount(ctx, id) {
    const claims = config.accounts[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'given_name', 'family_name', 'preferred_username'],
    groups: ['groups'],
  },
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  // fixed cookie keys: the provider is a test fixture, started fresh for each test
  cookies: { keys: ['cleverthis-test-oidc-provider-cookie-key'] },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));

provider.listen(port, '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${issuer}`);
});
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
