"""Request and response models of the CleverThis Compute Fleet API, generated from its OpenAPI schema.

Do not edit: regenerate with `python -m ctfleet.codegen schema.json > client/ctfleet/models.py`.
Schema: CleverThis Compute Fleet API 1.0.0.
"""

from __future__ import annotations

from typing import Any, Literal

def _opt(fn: Any, value: Any) -> Any:
    return None if value is None else fn(value)


def _list(fn: Any, value: Any) -> Any:
    return None if value is None else [fn(item) for item in value]


def _dump(value: Any) -> Any:
    return value.to_dict()


class _Model:
    """Base of the models: equality and repr over the fields (`__slots__`)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, f) == getattr(other, f) for f in self.__slots__  # type: ignore[attr-defined]
        )

    def __repr__(self) -> str:
        shown = (f'{f}={getattr(self, f)!r}' for f in self.__slots__)  # type: ignore[attr-defined]
        return f"{type(self).__name__}({', '.join(shown)})"

    __hash__ = None  # type: ignore[assignment]

BackendEnum = Literal['mp', 'ray']

ClusterModeEnum = Literal['standalone', 'kubernetes', 'argocd']

CommandCommandTypeEnum = Literal['container.create', 'container.start', 'container.stop', 'container.destroy', 'model.download', 'model.evict', 'endpoint.start', 'endpoint.stop', 'endpoint.adapter.load', 'endpoint.adapter.unload', 'ray.head.start', 'ray.worker.start', 'ray.node.drain', 'ray.node.stop', 'ray.status', 'ray.job.submit', 'ray.job.status', 'ray.job.stop', 'ray.serve.status', 'agent.update']

CommandDispatch = dict[str, Any]

CommandStatusEnum = Literal['queued', 'dispatched', 'running', 'succeeded', 'failed']

ContainerCreateCommandCommandTypeEnum = Literal['container.create']

ContainerCreatePayloadSecretFieldsEnum = Literal['command', 'registry_username']

ContainerDestroyCommandCommandTypeEnum = Literal['container.destroy']

ContainerStartCommandCommandTypeEnum = Literal['container.start']

ContainerStatusEnum = Literal['pending', 'created', 'running', 'stopping', 'exited', 'stopped', 'missing', 'failed', 'removed']

ContainerStopCommandCommandTypeEnum = Literal['container.stop']

EndpointAdapterLoadCommandCommandTypeEnum = Literal['endpoint.adapter.load']

EndpointAdapterUnloadCommandCommandTypeEnum = Literal['endpoint.adapter.unload']

EndpointBenchmarkStatusEnum = Literal['queued', 'running', 'succeeded', 'failed']

EndpointGroupRoleEnum = Literal['leader', 'follower']

EndpointStartCommandCommandTypeEnum = Literal['endpoint.start']

EndpointStartPayloadSecretFieldsEnum = Literal['extra_args']

EndpointStopCommandCommandTypeEnum = Literal['endpoint.stop']

EngineEnum = Literal['python', 'vllm']

FrameworkEnum = Literal['none', 'torch_ddp', 'torch_fsdp', 'deepspeed']

JobStatusEnum = Literal['queued', 'running', 'succeeded', 'failed', 'cancelled']

KindEnum = Literal['script', 'finetune']

LevelEnum = Literal['ok', 'warning', 'exceeded']

MembershipRoleEnum = Literal['owner', 'admin', 'member', 'viewer']

ModelDownloadCommandCommandTypeEnum = Literal['model.download']

ModelEvictCommandCommandTypeEnum = Literal['model.evict']

NodeStatusEnum = Literal['online', 'offline', 'cordoned', 'draining']

OutcomeEnum = Literal['ok', 'pending', 'failed', 'refused']

ProtocolEnum = Literal['tcp', 'udp']

QuotaEnum = Literal['gpus', 'vram_gib', 'cpu_cores', 'memory_gib', 'containers', 'endpoints', 'ray_clusters', 'ray_workers']

RayClusterStatusEnum = Literal['pending', 'running', 'failed', 'stopping', 'stopped', 'deleting']

RayNodeRoleEnum = Literal['head', 'worker']

RayNodeStatusEnum = Literal['starting', 'running', 'draining', 'stopping', 'stopped', 'failed']

RayRuntimeEnum = Literal['docker', 'process', 'kuberay']

RoutingPolicyEnum = Literal['least_load', 'session', 'prefix']

SchedulerEnum = Literal['fifo', 'asha', 'pbt']

ScopesEnum = Literal['read', 'operate', 'invoke']

ServeDeploymentStatusEnum = Literal['pending', 'deploying', 'running', 'degraded', 'unhealthy', 'failed', 'stopping', 'stopped']

StatusFa2Enum = Literal['pending', 'starting', 'running', 'stopping', 'stopped', 'failed', 'idle']

SubjectKindEnum = Literal['endpoint', 'adapter', 'cluster']

TuneExperimentModeEnum = Literal['min', 'max']


class AdapterAttach(_Model):
    """Input of POST /adapters/{id}/attach/ and .../detach/."""

    __slots__ = ('endpoint',)

    def __init__(
        self,
        *,
        endpoint: str,
    ) -> None:
        self.endpoint = endpoint

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdapterAttach:
        return cls(
            endpoint=data['endpoint'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['endpoint'] = self.endpoint
        return out


class AgentRegister(_Model):
    """Input of POST /agent/register (facts are checked against `agent.protocol.HostFacts`)."""

    __slots__ = ('token', 'csr_pem', 'facts', 'cluster_id',)

    def __init__(
        self,
        *,
        token: str,
        csr_pem: str,
        facts: dict[str, Any],
        cluster_id: str | None = None,
    ) -> None:
        self.token = token
        self.csr_pem = csr_pem
        self.facts = facts
        self.cluster_id = cluster_id

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentRegister:
        return cls(
            token=data['token'],
            csr_pem=data['csr_pem'],
            facts=data['facts'],
            cluster_id=data.get('cluster_id'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['token'] = self.token
        out['csr_pem'] = self.csr_pem
        out['facts'] = self.facts
        if self.cluster_id is not None:
            out['cluster_id'] = self.cluster_id
        return out


class AgentRegistered(_Model):
    """The answer of POST /agent/register: the node's id, its certificate and the CA to pin."""

    __slots__ = ('node_id', 'certificate_pem', 'ca_certificate_pem', 'tunnel_path', 'heartbeat_interval_s',)

    def __init__(
        self,
        *,
        node_id: str,
        certificate_pem: str,
        ca_certificate_pem: str,
        tunnel_path: str,
        heartbeat_interval_s: int,
    ) -> None:
        self.node_id = node_id
        self.certificate_pem = certificate_pem
        self.ca_certificate_pem = ca_certificate_pem
        self.tunnel_path = tunnel_path
        self.heartbeat_interval_s = heartbeat_interval_s

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentRegistered:
        return cls(
            node_id=data['node_id'],
            certificate_pem=data['certificate_pem'],
            ca_certificate_pem=data['ca_certificate_pem'],
            tunnel_path=data['tunnel_path'],
            heartbeat_interval_s=data['heartbeat_interval_s'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['node_id'] = self.node_id
        out['certificate_pem'] = self.certificate_pem
        out['ca_certificate_pem'] = self.ca_certificate_pem
        out['tunnel_path'] = self.tunnel_path
        out['heartbeat_interval_s'] = self.heartbeat_interval_s
        return out


class AgentUpdates(_Model):
    """AgentUpdates"""

    __slots__ = ('commands',)

    def __init__(
        self,
        *,
        commands: list[Command],
    ) -> None:
        self.commands = commands

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentUpdates:
        return cls(
            commands=_list(Command.from_dict, data['commands']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['commands'] = _list(_dump, self.commands)
        return out


class ApiKey(_Model):
    """A key as lists show it: never its secret."""

    __slots__ = ('id', 'name', 'workspace', 'key_prefix', 'scopes', 'endpoints', 'requests_per_min', 'tokens_per_min', 'expires_at', 'last_used_at', 'last_used_ip', 'revoked_at', 'created_at',)

    def __init__(
        self,
        *,
        id: int,
        name: str,
        workspace: str,
        key_prefix: str,
        scopes: Any,
        endpoints: list[str],
        requests_per_min: int | None,
        tokens_per_min: int | None,
        expires_at: str | None,
        last_used_at: str | None,
        last_used_ip: str | None,
        revoked_at: str | None,
        created_at: str,
    ) -> None:
        self.id = id
        self.name = name
        self.workspace = workspace
        self.key_prefix = key_prefix
        self.scopes = scopes
        self.endpoints = endpoints
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        self.expires_at = expires_at
        self.last_used_at = last_used_at
        self.last_used_ip = last_used_ip
        self.revoked_at = revoked_at
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ApiKey:
        return cls(
            id=data['id'],
            name=data['name'],
            workspace=data['workspace'],
            key_prefix=data['key_prefix'],
            scopes=data['scopes'],
            endpoints=data['endpoints'],
            requests_per_min=data['requests_per_min'],
            tokens_per_min=data['tokens_per_min'],
            expires_at=data['expires_at'],
            last_used_at=data['last_used_at'],
            last_used_ip=data['last_used_ip'],
            revoked_at=data['revoked_at'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['name'] = self.name
        out['workspace'] = self.workspace
        out['key_prefix'] = self.key_prefix
        out['scopes'] = self.scopes
        out['endpoints'] = self.endpoints
        out['requests_per_min'] = self.requests_per_min
        out['tokens_per_min'] = self.tokens_per_min
        out['expires_at'] = self.expires_at
        out['last_used_at'] = self.last_used_at
        out['last_used_ip'] = self.last_used_ip
        out['revoked_at'] = self.revoked_at
        out['created_at'] = self.created_at
        return out


class ApiKeyCreate(_Model):
    """What a new key needs."""

    __slots__ = ('workspace', 'name', 'scopes', 'endpoints', 'expires_at', 'requests_per_min', 'tokens_per_min',)

    def __init__(
        self,
        *,
        workspace: str,
        name: str,
        scopes: list[ScopesEnum],
        endpoints: list[str] | None = None,
        expires_at: str | None = None,
        requests_per_min: int | None = None,
        tokens_per_min: int | None = None,
    ) -> None:
        self.workspace = workspace
        self.name = name
        self.scopes = scopes
        self.endpoints = endpoints
        self.expires_at = expires_at
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ApiKeyCreate:
        return cls(
            workspace=data['workspace'],
            name=data['name'],
            scopes=data['scopes'],
            endpoints=data.get('endpoints'),
            expires_at=data.get('expires_at'),
            requests_per_min=data.get('requests_per_min'),
            tokens_per_min=data.get('tokens_per_min'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['name'] = self.name
        out['scopes'] = self.scopes
        if self.endpoints is not None:
            out['endpoints'] = self.endpoints
        if self.expires_at is not None:
            out['expires_at'] = self.expires_at
        if self.requests_per_min is not None:
            out['requests_per_min'] = self.requests_per_min
        if self.tokens_per_min is not None:
            out['tokens_per_min'] = self.tokens_per_min
        return out


class ApiKeyCreated(_Model):
    """A key just created, with its secret (shown this once)."""

    __slots__ = ('id', 'name', 'workspace', 'key_prefix', 'scopes', 'endpoints', 'requests_per_min', 'tokens_per_min', 'expires_at', 'last_used_at', 'last_used_ip', 'revoked_at', 'created_at', 'key',)

    def __init__(
        self,
        *,
        id: int,
        name: str,
        workspace: str,
        key_prefix: str,
        scopes: Any,
        endpoints: list[str],
        requests_per_min: int | None,
        tokens_per_min: int | None,
        expires_at: str | None,
        last_used_at: str | None,
        last_used_ip: str | None,
        revoked_at: str | None,
        created_at: str,
        key: str,
    ) -> None:
        self.id = id
        self.name = name
        self.workspace = workspace
        self.key_prefix = key_prefix
        self.scopes = scopes
        self.endpoints = endpoints
        self.requests_per_min = requests_per_min
        self.tokens_per_min = tokens_per_min
        self.expires_at = expires_at
        self.last_used_at = last_used_at
        self.last_used_ip = last_used_ip
        self.revoked_at = revoked_at
        self.created_at = created_at
        self.key = key

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ApiKeyCreated:
        return cls(
            id=data['id'],
            name=data['name'],
            workspace=data['workspace'],
            key_prefix=data['key_prefix'],
            scopes=data['scopes'],
            endpoints=data['endpoints'],
            requests_per_min=data['requests_per_min'],
            tokens_per_min=data['tokens_per_min'],
            expires_at=data['expires_at'],
            last_used_at=data['last_used_at'],
            last_used_ip=data['last_used_ip'],
            revoked_at=data['revoked_at'],
            created_at=data['created_at'],
            key=data['key'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['name'] = self.name
        out['workspace'] = self.workspace
        out['key_prefix'] = self.key_prefix
        out['scopes'] = self.scopes
        out['endpoints'] = self.endpoints
        out['requests_per_min'] = self.requests_per_min
        out['tokens_per_min'] = self.tokens_per_min
        out['expires_at'] = self.expires_at
        out['last_used_at'] = self.last_used_at
        out['last_used_ip'] = self.last_used_ip
        out['revoked_at'] = self.revoked_at
        out['created_at'] = self.created_at
        out['key'] = self.key
        return out


class AuditEntry(_Model):
    """One operator action: who (`actor`), what (`action`), on which target, when, and how it ended."""

    __slots__ = ('id', 'created_at', 'workspace', 'actor', 'action', 'target_type', 'target_id', 'target_name', 'outcome', 'reason', 'detail', 'git_commit', 'finished_at',)

    def __init__(
        self,
        *,
        id: str,
        created_at: str,
        workspace: str,
        actor: str,
        action: str,
        target_type: str,
        target_id: str,
        target_name: str,
        outcome: OutcomeEnum,
        reason: str,
        detail: Any,
        git_commit: str,
        finished_at: str | None,
    ) -> None:
        self.id = id
        self.created_at = created_at
        self.workspace = workspace
        self.actor = actor
        self.action = action
        self.target_type = target_type
        self.target_id = target_id
        self.target_name = target_name
        self.outcome = outcome
        self.reason = reason
        self.detail = detail
        self.git_commit = git_commit
        self.finished_at = finished_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditEntry:
        return cls(
            id=data['id'],
            created_at=data['created_at'],
            workspace=data['workspace'],
            actor=data['actor'],
            action=data['action'],
            target_type=data['target_type'],
            target_id=data['target_id'],
            target_name=data['target_name'],
            outcome=data['outcome'],
            reason=data['reason'],
            detail=data['detail'],
            git_commit=data['git_commit'],
            finished_at=data['finished_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['created_at'] = self.created_at
        out['workspace'] = self.workspace
        out['actor'] = self.actor
        out['action'] = self.action
        out['target_type'] = self.target_type
        out['target_id'] = self.target_id
        out['target_name'] = self.target_name
        out['outcome'] = self.outcome
        out['reason'] = self.reason
        out['detail'] = self.detail
        out['git_commit'] = self.git_commit
        out['finished_at'] = self.finished_at
        return out


class Budget(_Model):
    """A budget and its month so far (as of the latest minute's evaluation)."""

    __slots__ = ('id', 'workspace', 'api_key', 'token_limit', 'money_limit', 'hard_stop', 'webhook', 'month', 'spent_tokens', 'spent_money', 'level', 'shares', 'evaluated_at',)

    def __init__(
        self,
        *,
        id: int,
        workspace: str,
        api_key: int | None,
        token_limit: int | None,
        money_limit: str | None,
        hard_stop: bool,
        webhook: str,
        month: str,
        spent_tokens: int,
        spent_money: str,
        level: LevelEnum,
        shares: dict[str, float],
        evaluated_at: str | None,
    ) -> None:
        self.id = id
        self.workspace = workspace
        self.api_key = api_key
        self.token_limit = token_limit
        self.money_limit = money_limit
        self.hard_stop = hard_stop
        self.webhook = webhook
        self.month = month
        self.spent_tokens = spent_tokens
        self.spent_money = spent_money
        self.level = level
        self.shares = shares
        self.evaluated_at = evaluated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budget:
        return cls(
            id=data['id'],
            workspace=data['workspace'],
            api_key=data['api_key'],
            token_limit=data['token_limit'],
            money_limit=data['money_limit'],
            hard_stop=data['hard_stop'],
            webhook=data['webhook'],
            month=data['month'],
            spent_tokens=data['spent_tokens'],
            spent_money=data['spent_money'],
            level=data['level'],
            shares=data['shares'],
            evaluated_at=data['evaluated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['workspace'] = self.workspace
        out['api_key'] = self.api_key
        out['token_limit'] = self.token_limit
        out['money_limit'] = self.money_limit
        out['hard_stop'] = self.hard_stop
        out['webhook'] = self.webhook
        out['month'] = self.month
        out['spent_tokens'] = self.spent_tokens
        out['spent_money'] = self.spent_money
        out['level'] = self.level
        out['shares'] = self.shares
        out['evaluated_at'] = self.evaluated_at
        return out


class BudgetSet(_Model):
    """PUT budgets/: set (create or replace) the budget of a workspace, or of one of its API keys."""

    __slots__ = ('workspace', 'api_key', 'token_limit', 'money_limit', 'hard_stop', 'webhook_url',)

    def __init__(
        self,
        *,
        workspace: str,
        api_key: int | None = None,
        token_limit: int | None = None,
        money_limit: str | None = None,
        hard_stop: bool | None = None,
        webhook_url: Any = None,
    ) -> None:
        self.workspace = workspace
        self.api_key = api_key
        self.token_limit = token_limit
        self.money_limit = money_limit
        self.hard_stop = hard_stop
        self.webhook_url = webhook_url

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BudgetSet:
        return cls(
            workspace=data['workspace'],
            api_key=data.get('api_key'),
            token_limit=data.get('token_limit'),
            money_limit=data.get('money_limit'),
            hard_stop=data.get('hard_stop'),
            webhook_url=data.get('webhook_url'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        if self.api_key is not None:
            out['api_key'] = self.api_key
        if self.token_limit is not None:
            out['token_limit'] = self.token_limit
        if self.money_limit is not None:
            out['money_limit'] = self.money_limit
        if self.hard_stop is not None:
            out['hard_stop'] = self.hard_stop
        if self.webhook_url is not None:
            out['webhook_url'] = self.webhook_url
        return out


class CachedModel(_Model):
    """One snapshot in a node's cache."""

    __slots__ = ('id', 'model_id', 'revision', 'size_bytes', 'last_used_at', 'serving',)

    def __init__(
        self,
        *,
        id: str,
        model_id: str,
        revision: str,
        size_bytes: int,
        last_used_at: str | None,
        serving: list[str],
    ) -> None:
        self.id = id
        self.model_id = model_id
        self.revision = revision
        self.size_bytes = size_bytes
        self.last_used_at = last_used_at
        self.serving = serving

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CachedModel:
        return cls(
            id=data['id'],
            model_id=data['model_id'],
            revision=data['revision'],
            size_bytes=data['size_bytes'],
            last_used_at=data['last_used_at'],
            serving=data['serving'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['model_id'] = self.model_id
        out['revision'] = self.revision
        out['size_bytes'] = self.size_bytes
        out['last_used_at'] = self.last_used_at
        out['serving'] = self.serving
        return out


class CatalogCreate(_Model):
    """A private model of a workspace: a Hub repository and revision, or a folder on the nodes, and its sizes."""

    __slots__ = ('workspace', 'name', 'model_id', 'revision', 'local_path', 'description', 'params_b', 'context_length', 'layers', 'kv_heads', 'head_dim', 'attention_heads', 'quantizations', 'server_args', 'tags',)

    def __init__(
        self,
        *,
        workspace: str,
        name: str,
        model_id: str | None = None,
        revision: str | None = None,
        local_path: str | None = None,
        description: str | None = None,
        params_b: float,
        context_length: int | None = None,
        layers: int | None = None,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        attention_heads: int | None = None,
        quantizations: list[dict[str, Any]] | None = None,
        server_args: list[str] | None = None,
        tags: list[str] | None = None,
    ) -> None:
        self.workspace = workspace
        self.name = name
        self.model_id = model_id
        self.revision = revision
        self.local_path = local_path
        self.description = description
        self.params_b = params_b
        self.context_length = context_length
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.attention_heads = attention_heads
        self.quantizations = quantizations
        self.server_args = server_args
        self.tags = tags

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CatalogCreate:
        return cls(
            workspace=data['workspace'],
            name=data['name'],
            model_id=data.get('model_id'),
            revision=data.get('revision'),
            local_path=data.get('local_path'),
            description=data.get('description'),
            params_b=data['params_b'],
            context_length=data.get('context_length'),
            layers=data.get('layers'),
            kv_heads=data.get('kv_heads'),
            head_dim=data.get('head_dim'),
            attention_heads=data.get('attention_heads'),
            quantizations=data.get('quantizations'),
            server_args=data.get('server_args'),
            tags=data.get('tags'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['name'] = self.name
        if self.model_id is not None:
            out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        if self.local_path is not None:
            out['local_path'] = self.local_path
        if self.description is not None:
            out['description'] = self.description
        out['params_b'] = self.params_b
        if self.context_length is not None:
            out['context_length'] = self.context_length
        if self.layers is not None:
            out['layers'] = self.layers
        if self.kv_heads is not None:
            out['kv_heads'] = self.kv_heads
        if self.head_dim is not None:
            out['head_dim'] = self.head_dim
        if self.attention_heads is not None:
            out['attention_heads'] = self.attention_heads
        if self.quantizations is not None:
            out['quantizations'] = self.quantizations
        if self.server_args is not None:
            out['server_args'] = self.server_args
        if self.tags is not None:
            out['tags'] = self.tags
        return out


class CatalogFit(_Model):
    """One model at the asked context and batch: what it needs and each node's answer."""

    __slots__ = ('model', 'quantization', 'repo', 'context', 'batch', 'vram_mb', 'cpu_mb', 'nodes',)

    def __init__(
        self,
        *,
        model: CatalogModel,
        quantization: str,
        repo: str,
        context: int,
        batch: int,
        vram_mb: int,
        cpu_mb: int,
        nodes: list[NodeFit],
    ) -> None:
        self.model = model
        self.quantization = quantization
        self.repo = repo
        self.context = context
        self.batch = batch
        self.vram_mb = vram_mb
        self.cpu_mb = cpu_mb
        self.nodes = nodes

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CatalogFit:
        return cls(
            model=_opt(CatalogModel.from_dict, data['model']),
            quantization=data['quantization'],
            repo=data['repo'],
            context=data['context'],
            batch=data['batch'],
            vram_mb=data['vram_mb'],
            cpu_mb=data['cpu_mb'],
            nodes=_list(NodeFit.from_dict, data['nodes']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['model'] = _opt(_dump, self.model)
        out['quantization'] = self.quantization
        out['repo'] = self.repo
        out['context'] = self.context
        out['batch'] = self.batch
        out['vram_mb'] = self.vram_mb
        out['cpu_mb'] = self.cpu_mb
        out['nodes'] = _list(_dump, self.nodes)
        return out


class CatalogModel(_Model):
    """A catalog model; with the fit figures when listed."""

    __slots__ = ('id', 'workspace', 'curated', 'name', 'model_id', 'revision', 'local_path', 'description', 'params_b', 'context_length', 'layers', 'kv_heads', 'head_dim', 'attention_heads', 'quantizations', 'server_args', 'tags', 'catalog_version', 'created_at', 'updated_at',)

    def __init__(
        self,
        *,
        id: str,
        workspace: str | None,
        curated: bool,
        name: str,
        model_id: str,
        revision: str,
        local_path: str,
        description: str,
        params_b: float,
        context_length: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        attention_heads: int,
        quantizations: Any,
        server_args: Any,
        tags: Any,
        catalog_version: int,
        created_at: str,
        updated_at: str,
    ) -> None:
        self.id = id
        self.workspace = workspace
        self.curated = curated
        self.name = name
        self.model_id = model_id
        self.revision = revision
        self.local_path = local_path
        self.description = description
        self.params_b = params_b
        self.context_length = context_length
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.attention_heads = attention_heads
        self.quantizations = quantizations
        self.server_args = server_args
        self.tags = tags
        self.catalog_version = catalog_version
        self.created_at = created_at
        self.updated_at = updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CatalogModel:
        return cls(
            id=data['id'],
            workspace=data['workspace'],
            curated=data['curated'],
            name=data['name'],
            model_id=data['model_id'],
            revision=data['revision'],
            local_path=data['local_path'],
            description=data['description'],
            params_b=data['params_b'],
            context_length=data['context_length'],
            layers=data['layers'],
            kv_heads=data['kv_heads'],
            head_dim=data['head_dim'],
            attention_heads=data['attention_heads'],
            quantizations=data['quantizations'],
            server_args=data['server_args'],
            tags=data['tags'],
            catalog_version=data['catalog_version'],
            created_at=data['created_at'],
            updated_at=data['updated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['workspace'] = self.workspace
        out['curated'] = self.curated
        out['name'] = self.name
        out['model_id'] = self.model_id
        out['revision'] = self.revision
        out['local_path'] = self.local_path
        out['description'] = self.description
        out['params_b'] = self.params_b
        out['context_length'] = self.context_length
        out['layers'] = self.layers
        out['kv_heads'] = self.kv_heads
        out['head_dim'] = self.head_dim
        out['attention_heads'] = self.attention_heads
        out['quantizations'] = self.quantizations
        out['server_args'] = self.server_args
        out['tags'] = self.tags
        out['catalog_version'] = self.catalog_version
        out['created_at'] = self.created_at
        out['updated_at'] = self.updated_at
        return out


class Cluster(_Model):
    """A compute cluster; the ArgoCD token is write-only (`argocd_token_set` tells whether one is stored)."""

    __slots__ = ('id', 'workspace', 'name', 'description', 'mode', 'argocd_server', 'argocd_token_set', 'git_repo_url', 'git_branch', 'node_count', 'automation_paused_until', 'auto_update_agents', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        workspace: str,
        name: str,
        description: str,
        mode: ClusterModeEnum,
        argocd_server: str,
        argocd_token_set: bool,
        git_repo_url: str,
        git_branch: str,
        node_count: int,
        automation_paused_until: str | None,
        auto_update_agents: bool,
        created_at: str,
    ) -> None:
        self.id = id
        self.workspace = workspace
        self.name = name
        self.description = description
        self.mode = mode
        self.argocd_server = argocd_server
        self.argocd_token_set = argocd_token_set
        self.git_repo_url = git_repo_url
        self.git_branch = git_branch
        self.node_count = node_count
        self.automation_paused_until = automation_paused_until
        self.auto_update_agents = auto_update_agents
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cluster:
        return cls(
            id=data['id'],
            workspace=data['workspace'],
            name=data['name'],
            description=data['description'],
            mode=data['mode'],
            argocd_server=data['argocd_server'],
            argocd_token_set=data['argocd_token_set'],
            git_repo_url=data['git_repo_url'],
            git_branch=data['git_branch'],
            node_count=data['node_count'],
            automation_paused_until=data['automation_paused_until'],
            auto_update_agents=data['auto_update_agents'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['workspace'] = self.workspace
        out['name'] = self.name
        out['description'] = self.description
        out['mode'] = self.mode
        out['argocd_server'] = self.argocd_server
        out['argocd_token_set'] = self.argocd_token_set
        out['git_repo_url'] = self.git_repo_url
        out['git_branch'] = self.git_branch
        out['node_count'] = self.node_count
        out['automation_paused_until'] = self.automation_paused_until
        out['auto_update_agents'] = self.auto_update_agents
        out['created_at'] = self.created_at
        return out


class ClusterCreate(_Model):
    """Input of POST /clusters."""

    __slots__ = ('name', 'description', 'argocd_server', 'argocd_token', 'git_repo_url', 'git_branch', 'workspace', 'mode',)

    def __init__(
        self,
        *,
        name: str,
        description: str | None = None,
        argocd_server: str | None = None,
        argocd_token: str | None = None,
        git_repo_url: str | None = None,
        git_branch: str | None = None,
        workspace: str,
        mode: ClusterModeEnum | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.argocd_server = argocd_server
        self.argocd_token = argocd_token
        self.git_repo_url = git_repo_url
        self.git_branch = git_branch
        self.workspace = workspace
        self.mode = mode

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterCreate:
        return cls(
            name=data['name'],
            description=data.get('description'),
            argocd_server=data.get('argocd_server'),
            argocd_token=data.get('argocd_token'),
            git_repo_url=data.get('git_repo_url'),
            git_branch=data.get('git_branch'),
            workspace=data['workspace'],
            mode=data.get('mode'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        if self.description is not None:
            out['description'] = self.description
        if self.argocd_server is not None:
            out['argocd_server'] = self.argocd_server
        if self.argocd_token is not None:
            out['argocd_token'] = self.argocd_token
        if self.git_repo_url is not None:
            out['git_repo_url'] = self.git_repo_url
        if self.git_branch is not None:
            out['git_branch'] = self.git_branch
        out['workspace'] = self.workspace
        if self.mode is not None:
            out['mode'] = self.mode
        return out


class ClusterUpdate(_Model):
    """Input of PATCH/PUT /clusters/{id}; `mode` is accepted only unchanged."""

    __slots__ = ('name', 'description', 'argocd_server', 'argocd_token', 'git_repo_url', 'git_branch', 'mode', 'auto_update_agents',)

    def __init__(
        self,
        *,
        name: str,
        description: str | None = None,
        argocd_server: str | None = None,
        argocd_token: str | None = None,
        git_repo_url: str | None = None,
        git_branch: str | None = None,
        mode: str | None = None,
        auto_update_agents: bool | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.argocd_server = argocd_server
        self.argocd_token = argocd_token
        self.git_repo_url = git_repo_url
        self.git_branch = git_branch
        self.mode = mode
        self.auto_update_agents = auto_update_agents

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterUpdate:
        return cls(
            name=data['name'],
            description=data.get('description'),
            argocd_server=data.get('argocd_server'),
            argocd_token=data.get('argocd_token'),
            git_repo_url=data.get('git_repo_url'),
            git_branch=data.get('git_branch'),
            mode=data.get('mode'),
            auto_update_agents=data.get('auto_update_agents'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        if self.description is not None:
            out['description'] = self.description
        if self.argocd_server is not None:
            out['argocd_server'] = self.argocd_server
        if self.argocd_token is not None:
            out['argocd_token'] = self.argocd_token
        if self.git_repo_url is not None:
            out['git_repo_url'] = self.git_repo_url
        if self.git_branch is not None:
            out['git_branch'] = self.git_branch
        if self.mode is not None:
            out['mode'] = self.mode
        if self.auto_update_agents is not None:
            out['auto_update_agents'] = self.auto_update_agents
        return out


class Command(_Model):
    """A command on one node (secret payload values are never returned: masked, or left out)."""

    __slots__ = ('id', 'cluster', 'node', 'node_name', 'batch_id', 'command_type', 'payload', 'idempotency_key', 'status', 'attempts', 'created_by', 'system', 'created_at', 'dispatched_at', 'acked_at', 'finished_at', 'result', 'error_code', 'error_message',)

    def __init__(
        self,
        *,
        id: str,
        cluster: str,
        node: str,
        node_name: str,
        batch_id: str,
        command_type: CommandCommandTypeEnum,
        payload: Any,
        idempotency_key: str,
        status: CommandStatusEnum,
        attempts: int,
        created_by: str,
        system: bool,
        created_at: str,
        dispatched_at: str | None,
        acked_at: str | None,
        finished_at: str | None,
        result: Any,
        error_code: str,
        error_message: str,
    ) -> None:
        self.id = id
        self.cluster = cluster
        self.node = node
        self.node_name = node_name
        self.batch_id = batch_id
        self.command_type = command_type
        self.payload = payload
        self.idempotency_key = idempotency_key
        self.status = status
        self.attempts = attempts
        self.created_by = created_by
        self.system = system
        self.created_at = created_at
        self.dispatched_at = dispatched_at
        self.acked_at = acked_at
        self.finished_at = finished_at
        self.result = result
        self.error_code = error_code
        self.error_message = error_message

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Command:
        return cls(
            id=data['id'],
            cluster=data['cluster'],
            node=data['node'],
            node_name=data['node_name'],
            batch_id=data['batch_id'],
            command_type=data['command_type'],
            payload=data['payload'],
            idempotency_key=data['idempotency_key'],
            status=data['status'],
            attempts=data['attempts'],
            created_by=data['created_by'],
            system=data['system'],
            created_at=data['created_at'],
            dispatched_at=data['dispatched_at'],
            acked_at=data['acked_at'],
            finished_at=data['finished_at'],
            result=data['result'],
            error_code=data['error_code'],
            error_message=data['error_message'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['cluster'] = self.cluster
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['batch_id'] = self.batch_id
        out['command_type'] = self.command_type
        out['payload'] = self.payload
        out['idempotency_key'] = self.idempotency_key
        out['status'] = self.status
        out['attempts'] = self.attempts
        out['created_by'] = self.created_by
        out['system'] = self.system
        out['created_at'] = self.created_at
        out['dispatched_at'] = self.dispatched_at
        out['acked_at'] = self.acked_at
        out['finished_at'] = self.finished_at
        out['result'] = self.result
        out['error_code'] = self.error_code
        out['error_message'] = self.error_message
        return out


class CommandBatch(_Model):
    """The answer of POST /clusters/{id}/commands: one command per target node, sharing `batch_id`."""

    __slots__ = ('batch_id', 'commands',)

    def __init__(
        self,
        *,
        batch_id: str,
        commands: list[Command],
    ) -> None:
        self.batch_id = batch_id
        self.commands = commands

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandBatch:
        return cls(
            batch_id=data['batch_id'],
            commands=_list(Command.from_dict, data['commands']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['batch_id'] = self.batch_id
        out['commands'] = _list(_dump, self.commands)
        return out


class CommandPage(_Model):
    """A page of rows (`limit`/`offset`); `next`/`previous` link the neighbouring pages."""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None,
        previous: str | None,
        results: list[Command],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandPage:
        return cls(
            count=data['count'],
            next=data['next'],
            previous=data['previous'],
            results=_list(Command.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        out['next'] = self.next
        out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class CommandRef(_Model):
    """A command the request queued."""

    __slots__ = ('command', 'status',)

    def __init__(
        self,
        *,
        command: str,
        status: str,
    ) -> None:
        self.command = command
        self.status = status

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandRef:
        return cls(
            command=data['command'],
            status=data['status'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command'] = self.command
        out['status'] = self.status
        return out


class Container(_Model):
    """A workload container on a node; `error_help` explains `error_code`."""

    __slots__ = ('id', 'node', 'node_name', 'cluster', 'container_id', 'name', 'image', 'status', 'spec', 'replacement_of', 'created_by_command', 'error_code', 'error_message', 'error_help', 'created_at', 'updated_at',)

    def __init__(
        self,
        *,
        id: str,
        node: str,
        node_name: str,
        cluster: str,
        container_id: str,
        name: str,
        image: str,
        status: ContainerStatusEnum,
        spec: Any,
        replacement_of: str | None,
        created_by_command: str | None,
        error_code: str,
        error_message: str,
        error_help: dict[str, str] | None,
        created_at: str,
        updated_at: str,
    ) -> None:
        self.id = id
        self.node = node
        self.node_name = node_name
        self.cluster = cluster
        self.container_id = container_id
        self.name = name
        self.image = image
        self.status = status
        self.spec = spec
        self.replacement_of = replacement_of
        self.created_by_command = created_by_command
        self.error_code = error_code
        self.error_message = error_message
        self.error_help = error_help
        self.created_at = created_at
        self.updated_at = updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Container:
        return cls(
            id=data['id'],
            node=data['node'],
            node_name=data['node_name'],
            cluster=data['cluster'],
            container_id=data['container_id'],
            name=data['name'],
            image=data['image'],
            status=data['status'],
            spec=data['spec'],
            replacement_of=data['replacement_of'],
            created_by_command=data['created_by_command'],
            error_code=data['error_code'],
            error_message=data['error_message'],
            error_help=data['error_help'],
            created_at=data['created_at'],
            updated_at=data['updated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['cluster'] = self.cluster
        out['container_id'] = self.container_id
        out['name'] = self.name
        out['image'] = self.image
        out['status'] = self.status
        out['spec'] = self.spec
        out['replacement_of'] = self.replacement_of
        out['created_by_command'] = self.created_by_command
        out['error_code'] = self.error_code
        out['error_message'] = self.error_message
        out['error_help'] = self.error_help
        out['created_at'] = self.created_at
        out['updated_at'] = self.updated_at
        return out


class ContainerCreateCommand(_Model):
    """A `container.create` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: ContainerCreateCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: ContainerCreatePayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerCreateCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(ContainerCreatePayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class ContainerCreatePayload(_Model):
    """container.create: run `image` as `name` with resource requests."""

    __slots__ = ('image', 'name', 'command', 'env', 'ports', 'cpu', 'memory_mb', 'gpus', 'labels', 'endpoint_host', 'registry_username', 'registry_password', 'start', 'secret_fields',)

    def __init__(
        self,
        *,
        image: str,
        name: str,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        ports: list[PortMapping] | None = None,
        cpu: float | None = None,
        memory_mb: int | None = None,
        gpus: int | None = None,
        labels: dict[str, str] | None = None,
        endpoint_host: str | None = None,
        registry_username: str | None = None,
        registry_password: str | None = None,
        start: bool | None = None,
        secret_fields: list[ContainerCreatePayloadSecretFieldsEnum] | None = None,
    ) -> None:
        self.image = image
        self.name = name
        self.command = command
        self.env = env
        self.ports = ports
        self.cpu = cpu
        self.memory_mb = memory_mb
        self.gpus = gpus
        self.labels = labels
        self.endpoint_host = endpoint_host
        self.registry_username = registry_username
        self.registry_password = registry_password
        self.start = start
        self.secret_fields = secret_fields

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerCreatePayload:
        return cls(
            image=data['image'],
            name=data['name'],
            command=data.get('command'),
            env=data.get('env'),
            ports=_list(PortMapping.from_dict, data.get('ports')),
            cpu=data.get('cpu'),
            memory_mb=data.get('memory_mb'),
            gpus=data.get('gpus'),
            labels=data.get('labels'),
            endpoint_host=data.get('endpoint_host'),
            registry_username=data.get('registry_username'),
            registry_password=data.get('registry_password'),
            start=data.get('start'),
            secret_fields=data.get('secret_fields'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['image'] = self.image
        out['name'] = self.name
        if self.command is not None:
            out['command'] = self.command
        if self.env is not None:
            out['env'] = self.env
        if self.ports is not None:
            out['ports'] = _list(_dump, self.ports)
        if self.cpu is not None:
            out['cpu'] = self.cpu
        if self.memory_mb is not None:
            out['memory_mb'] = self.memory_mb
        if self.gpus is not None:
            out['gpus'] = self.gpus
        if self.labels is not None:
            out['labels'] = self.labels
        if self.endpoint_host is not None:
            out['endpoint_host'] = self.endpoint_host
        if self.registry_username is not None:
            out['registry_username'] = self.registry_username
        if self.registry_password is not None:
            out['registry_password'] = self.registry_password
        if self.start is not None:
            out['start'] = self.start
        if self.secret_fields is not None:
            out['secret_fields'] = self.secret_fields
        return out


class ContainerDestroyCommand(_Model):
    """A `container.destroy` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: ContainerDestroyCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: ContainerRefPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerDestroyCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(ContainerRefPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class ContainerRefPayload(_Model):
    """container.start / container.stop / container.destroy: which container, by id or name."""

    __slots__ = ('container', 'timeout_s',)

    def __init__(
        self,
        *,
        container: str,
        timeout_s: int | None = None,
    ) -> None:
        self.container = container
        self.timeout_s = timeout_s

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerRefPayload:
        return cls(
            container=data['container'],
            timeout_s=data.get('timeout_s'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['container'] = self.container
        if self.timeout_s is not None:
            out['timeout_s'] = self.timeout_s
        return out


class ContainerStartCommand(_Model):
    """A `container.start` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: ContainerStartCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: ContainerRefPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerStartCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(ContainerRefPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class ContainerStopCommand(_Model):
    """A `container.stop` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: ContainerStopCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: ContainerRefPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerStopCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(ContainerRefPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class Download(_Model):
    """A model.download under way."""

    __slots__ = ('command', 'model_id', 'status', 'bytes_done', 'bytes_total', 'bytes_per_s', 'percent',)

    def __init__(
        self,
        *,
        command: str,
        model_id: str,
        status: str,
        bytes_done: int | None,
        bytes_total: int | None,
        bytes_per_s: int | None,
        percent: float | None,
    ) -> None:
        self.command = command
        self.model_id = model_id
        self.status = status
        self.bytes_done = bytes_done
        self.bytes_total = bytes_total
        self.bytes_per_s = bytes_per_s
        self.percent = percent

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Download:
        return cls(
            command=data['command'],
            model_id=data['model_id'],
            status=data['status'],
            bytes_done=data['bytes_done'],
            bytes_total=data['bytes_total'],
            bytes_per_s=data['bytes_per_s'],
            percent=data['percent'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command'] = self.command
        out['model_id'] = self.model_id
        out['status'] = self.status
        out['bytes_done'] = self.bytes_done
        out['bytes_total'] = self.bytes_total
        out['bytes_per_s'] = self.bytes_per_s
        out['percent'] = self.percent
        return out


class Endpoint(_Model):
    """An inference endpoint, its public URL, its replicas, and on failure the agent's code with `error_help`."""

    __slots__ = ('id', 'slug', 'url', 'cluster', 'node', 'node_name', 'model_id', 'revision', 'gpus', 'min_vram_mb', 'ray_cluster', 'pipeline_parallel', 'tensor_parallel', 'master_port', 'server_args', 'status', 'port', 'public', 'min_replicas', 'max_replicas', 'target_requests_per_min', 'target_in_flight', 'target_tokens_per_s', 'scale_cooldown_s', 'scaled_at', 'idle_timeout_s', 'idle_since', 'key_requests_per_min', 'key_tokens_per_min', 'routing_policy', 'target_queued', 'max_concurrency', 'queue_max_depth', 'queue_max_wait_s', 'concurrency_limit', 'queue', 'replicas', 'failure_code', 'failure_message', 'error_help', 'start_command', 'stop_command', 'created_by', 'created_at', 'updated_at',)

    def __init__(
        self,
        *,
        id: str,
        slug: str,
        url: str,
        cluster: str,
        node: str | None,
        node_name: str,
        model_id: str,
        revision: str,
        gpus: int,
        min_vram_mb: int,
        ray_cluster: str | None,
        pipeline_parallel: int,
        tensor_parallel: int,
        master_port: int,
        server_args: Any,
        status: StatusFa2Enum,
        port: int,
        public: bool,
        min_replicas: int,
        max_replicas: int,
        target_requests_per_min: int,
        target_in_flight: int,
        target_tokens_per_s: int,
        scale_cooldown_s: int,
        scaled_at: str | None,
        idle_timeout_s: int,
        idle_since: str | None,
        key_requests_per_min: int | None,
        key_tokens_per_min: int | None,
        routing_policy: RoutingPolicyEnum,
        target_queued: int,
        max_concurrency: int | None,
        queue_max_depth: int | None,
        queue_max_wait_s: int | None,
        concurrency_limit: int,
        queue: QueueFigures | None,
        replicas: list[EndpointReplica],
        failure_code: str,
        failure_message: str,
        error_help: dict[str, str] | None,
        start_command: str | None,
        stop_command: str | None,
        created_by: str,
        created_at: str,
        updated_at: str,
    ) -> None:
        self.id = id
        self.slug = slug
        self.url = url
        self.cluster = cluster
        self.node = node
        self.node_name = node_name
        self.model_id = model_id
        self.revision = revision
        self.gpus = gpus
        self.min_vram_mb = min_vram_mb
        self.ray_cluster = ray_cluster
        self.pipeline_parallel = pipeline_parallel
        self.tensor_parallel = tensor_parallel
        self.master_port = master_port
        self.server_args = server_args
        self.status = status
        self.port = port
        self.public = public
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.target_requests_per_min = target_requests_per_min
        self.target_in_flight = target_in_flight
        self.target_tokens_per_s = target_tokens_per_s
        self.scale_cooldown_s = scale_cooldown_s
        self.scaled_at = scaled_at
        self.idle_timeout_s = idle_timeout_s
        self.idle_since = idle_since
        self.key_requests_per_min = key_requests_per_min
        self.key_tokens_per_min = key_tokens_per_min
        self.routing_policy = routing_policy
        self.target_queued = target_queued
        self.max_concurrency = max_concurrency
        self.queue_max_depth = queue_max_depth
        self.queue_max_wait_s = queue_max_wait_s
        self.concurrency_limit = concurrency_limit
        self.queue = queue
        self.replicas = replicas
        self.failure_code = failure_code
        self.failure_message = failure_message
        self.error_help = error_help
        self.start_command = start_command
        self.stop_command = stop_command
        self.created_by = created_by
        self.created_at = created_at
        self.updated_at = updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Endpoint:
        return cls(
            id=data['id'],
            slug=data['slug'],
            url=data['url'],
            cluster=data['cluster'],
            node=data['node'],
            node_name=data['node_name'],
            model_id=data['model_id'],
            revision=data['revision'],
            gpus=data['gpus'],
            min_vram_mb=data['min_vram_mb'],
            ray_cluster=data['ray_cluster'],
            pipeline_parallel=data['pipeline_parallel'],
            tensor_parallel=data['tensor_parallel'],
            master_port=data['master_port'],
            server_args=data['server_args'],
            status=data['status'],
            port=data['port'],
            public=data['public'],
            min_replicas=data['min_replicas'],
            max_replicas=data['max_replicas'],
            target_requests_per_min=data['target_requests_per_min'],
            target_in_flight=data['target_in_flight'],
            target_tokens_per_s=data['target_tokens_per_s'],
            scale_cooldown_s=data['scale_cooldown_s'],
            scaled_at=data['scaled_at'],
            idle_timeout_s=data['idle_timeout_s'],
            idle_since=data['idle_since'],
            key_requests_per_min=data['key_requests_per_min'],
            key_tokens_per_min=data['key_tokens_per_min'],
            routing_policy=data['routing_policy'],
            target_queued=data['target_queued'],
            max_concurrency=data['max_concurrency'],
            queue_max_depth=data['queue_max_depth'],
            queue_max_wait_s=data['queue_max_wait_s'],
            concurrency_limit=data['concurrency_limit'],
            queue=_opt(QueueFigures.from_dict, data['queue']),
            replicas=_list(EndpointReplica.from_dict, data['replicas']),
            failure_code=data['failure_code'],
            failure_message=data['failure_message'],
            error_help=data['error_help'],
            start_command=data['start_command'],
            stop_command=data['stop_command'],
            created_by=data['created_by'],
            created_at=data['created_at'],
            updated_at=data['updated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['slug'] = self.slug
        out['url'] = self.url
        out['cluster'] = self.cluster
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['model_id'] = self.model_id
        out['revision'] = self.revision
        out['gpus'] = self.gpus
        out['min_vram_mb'] = self.min_vram_mb
        out['ray_cluster'] = self.ray_cluster
        out['pipeline_parallel'] = self.pipeline_parallel
        out['tensor_parallel'] = self.tensor_parallel
        out['master_port'] = self.master_port
        out['server_args'] = self.server_args
        out['status'] = self.status
        out['port'] = self.port
        out['public'] = self.public
        out['min_replicas'] = self.min_replicas
        out['max_replicas'] = self.max_replicas
        out['target_requests_per_min'] = self.target_requests_per_min
        out['target_in_flight'] = self.target_in_flight
        out['target_tokens_per_s'] = self.target_tokens_per_s
        out['scale_cooldown_s'] = self.scale_cooldown_s
        out['scaled_at'] = self.scaled_at
        out['idle_timeout_s'] = self.idle_timeout_s
        out['idle_since'] = self.idle_since
        out['key_requests_per_min'] = self.key_requests_per_min
        out['key_tokens_per_min'] = self.key_tokens_per_min
        out['routing_policy'] = self.routing_policy
        out['target_queued'] = self.target_queued
        out['max_concurrency'] = self.max_concurrency
        out['queue_max_depth'] = self.queue_max_depth
        out['queue_max_wait_s'] = self.queue_max_wait_s
        out['concurrency_limit'] = self.concurrency_limit
        out['queue'] = _opt(_dump, self.queue)
        out['replicas'] = _list(_dump, self.replicas)
        out['failure_code'] = self.failure_code
        out['failure_message'] = self.failure_message
        out['error_help'] = self.error_help
        out['start_command'] = self.start_command
        out['stop_command'] = self.stop_command
        out['created_by'] = self.created_by
        out['created_at'] = self.created_at
        out['updated_at'] = self.updated_at
        return out


class EndpointAdapterLoadCommand(_Model):
    """A `endpoint.adapter.load` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: EndpointAdapterLoadCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: EndpointAdapterLoadPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointAdapterLoadCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(EndpointAdapterLoadPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class EndpointAdapterLoadPayload(_Model):
    """endpoint.adapter.load: load a LoRA adapter into a running server without a restart (vLLM's /v1/load_lora_adapter); loading one already loaded answers loaded again."""

    __slots__ = ('endpoint_id', 'adapter',)

    def __init__(
        self,
        *,
        endpoint_id: str,
        adapter: LoraAdapterRef,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.adapter = adapter

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointAdapterLoadPayload:
        return cls(
            endpoint_id=data['endpoint_id'],
            adapter=_opt(LoraAdapterRef.from_dict, data['adapter']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['endpoint_id'] = self.endpoint_id
        out['adapter'] = _opt(_dump, self.adapter)
        return out


class EndpointAdapterUnloadCommand(_Model):
    """A `endpoint.adapter.unload` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: EndpointAdapterUnloadCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: EndpointAdapterUnloadPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointAdapterUnloadCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(EndpointAdapterUnloadPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class EndpointAdapterUnloadPayload(_Model):
    """endpoint.adapter.unload: unload a LoRA adapter from a running server (vLLM's /v1/unload_lora_adapter); one not loaded answers unloaded."""

    __slots__ = ('endpoint_id', 'name',)

    def __init__(
        self,
        *,
        endpoint_id: str,
        name: str,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.name = name

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointAdapterUnloadPayload:
        return cls(
            endpoint_id=data['endpoint_id'],
            name=data['name'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['endpoint_id'] = self.endpoint_id
        out['name'] = self.name
        return out


class EndpointAdmission(_Model):
    """Input of POST /endpoints/<id>/admission/: the concurrency limit per replica and the queue's bounds (null: the default; left out: kept)."""

    __slots__ = ('max_concurrency', 'queue_max_depth', 'queue_max_wait_s',)

    def __init__(
        self,
        *,
        max_concurrency: int | None = None,
        queue_max_depth: int | None = None,
        queue_max_wait_s: int | None = None,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.queue_max_depth = queue_max_depth
        self.queue_max_wait_s = queue_max_wait_s

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointAdmission:
        return cls(
            max_concurrency=data.get('max_concurrency'),
            queue_max_depth=data.get('queue_max_depth'),
            queue_max_wait_s=data.get('queue_max_wait_s'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_concurrency is not None:
            out['max_concurrency'] = self.max_concurrency
        if self.queue_max_depth is not None:
            out['queue_max_depth'] = self.queue_max_depth
        if self.queue_max_wait_s is not None:
            out['queue_max_wait_s'] = self.queue_max_wait_s
        return out


class EndpointBenchmark(_Model):
    """A benchmark: its settings, the endpoint's revision, server arguments and routing policy at the time, its progress (`requests_done`) and, once it succeeded, its report (figures, errors by kind, per-second series)."""

    __slots__ = ('id', 'endpoint', 'status', 'concurrency', 'prompt_tokens', 'output_tokens', 'duration_s', 'turns', 'revision', 'server_args', 'routing_policy', 'requests_done', 'report', 'failure_message', 'created_by', 'created_at', 'started_at', 'finished_at',)

    def __init__(
        self,
        *,
        id: str,
        endpoint: str,
        status: EndpointBenchmarkStatusEnum,
        concurrency: int,
        prompt_tokens: int,
        output_tokens: int,
        duration_s: int,
        turns: int,
        revision: str,
        server_args: Any,
        routing_policy: RoutingPolicyEnum,
        requests_done: int,
        report: Any,
        failure_message: str,
        created_by: int | None,
        created_at: str,
        started_at: str | None,
        finished_at: str | None,
    ) -> None:
        self.id = id
        self.endpoint = endpoint
        self.status = status
        self.concurrency = concurrency
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.duration_s = duration_s
        self.turns = turns
        self.revision = revision
        self.server_args = server_args
        self.routing_policy = routing_policy
        self.requests_done = requests_done
        self.report = report
        self.failure_message = failure_message
        self.created_by = created_by
        self.created_at = created_at
        self.started_at = started_at
        self.finished_at = finished_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointBenchmark:
        return cls(
            id=data['id'],
            endpoint=data['endpoint'],
            status=data['status'],
            concurrency=data['concurrency'],
            prompt_tokens=data['prompt_tokens'],
            output_tokens=data['output_tokens'],
            duration_s=data['duration_s'],
            turns=data['turns'],
            revision=data['revision'],
            server_args=data['server_args'],
            routing_policy=data['routing_policy'],
            requests_done=data['requests_done'],
            report=data['report'],
            failure_message=data['failure_message'],
            created_by=data['created_by'],
            created_at=data['created_at'],
            started_at=data['started_at'],
            finished_at=data['finished_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['endpoint'] = self.endpoint
        out['status'] = self.status
        out['concurrency'] = self.concurrency
        out['prompt_tokens'] = self.prompt_tokens
        out['output_tokens'] = self.output_tokens
        out['duration_s'] = self.duration_s
        out['turns'] = self.turns
        out['revision'] = self.revision
        out['server_args'] = self.server_args
        out['routing_policy'] = self.routing_policy
        out['requests_done'] = self.requests_done
        out['report'] = self.report
        out['failure_message'] = self.failure_message
        out['created_by'] = self.created_by
        out['created_at'] = self.created_at
        out['started_at'] = self.started_at
        out['finished_at'] = self.finished_at
        return out


class EndpointBenchmarkCreate(_Model):
    """What to run: `concurrency` clients sending streamed chat completions back to back for `duration_s`, each prompt about `prompt_tokens` words, asking `output_tokens` tokens; `turns` > 1: conversations of that many turns, each resending its history."""

    __slots__ = ('endpoint', 'concurrency', 'prompt_tokens', 'output_tokens', 'duration_s', 'turns',)

    def __init__(
        self,
        *,
        endpoint: str,
        concurrency: int,
        prompt_tokens: int,
        output_tokens: int,
        duration_s: int,
        turns: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.concurrency = concurrency
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.duration_s = duration_s
        self.turns = turns

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointBenchmarkCreate:
        return cls(
            endpoint=data['endpoint'],
            concurrency=data['concurrency'],
            prompt_tokens=data['prompt_tokens'],
            output_tokens=data['output_tokens'],
            duration_s=data['duration_s'],
            turns=data.get('turns'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['endpoint'] = self.endpoint
        out['concurrency'] = self.concurrency
        out['prompt_tokens'] = self.prompt_tokens
        out['output_tokens'] = self.output_tokens
        out['duration_s'] = self.duration_s
        if self.turns is not None:
            out['turns'] = self.turns
        return out


class EndpointCreate(_Model):
    """Input of POST /endpoints/."""

    __slots__ = ('cluster', 'node', 'model_id', 'revision', 'gpus', 'min_vram_mb', 'public', 'min_replicas', 'max_replicas', 'target_requests_per_min', 'target_in_flight', 'target_tokens_per_s', 'scale_cooldown_s', 'idle_timeout_s', 'server_args', 'key_requests_per_min', 'key_tokens_per_min', 'routing_policy', 'target_queued', 'max_concurrency', 'queue_max_depth', 'queue_max_wait_s', 'ray_cluster', 'pipeline_parallel', 'tensor_parallel',)

    def __init__(
        self,
        *,
        cluster: str,
        node: str | None = None,
        model_id: str,
        revision: str | None = None,
        gpus: int | None = None,
        min_vram_mb: int | None = None,
        public: bool | None = None,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        target_requests_per_min: int | None = None,
        target_in_flight: int | None = None,
        target_tokens_per_s: int | None = None,
        scale_cooldown_s: int | None = None,
        idle_timeout_s: int | None = None,
        server_args: list[str] | None = None,
        key_requests_per_min: int | None = None,
        key_tokens_per_min: int | None = None,
        routing_policy: RoutingPolicyEnum | None = None,
        target_queued: int | None = None,
        max_concurrency: int | None = None,
        queue_max_depth: int | None = None,
        queue_max_wait_s: int | None = None,
        ray_cluster: str | None = None,
        pipeline_parallel: int | None = None,
        tensor_parallel: int | None = None,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.model_id = model_id
        self.revision = revision
        self.gpus = gpus
        self.min_vram_mb = min_vram_mb
        self.public = public
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.target_requests_per_min = target_requests_per_min
        self.target_in_flight = target_in_flight
        self.target_tokens_per_s = target_tokens_per_s
        self.scale_cooldown_s = scale_cooldown_s
        self.idle_timeout_s = idle_timeout_s
        self.server_args = server_args
        self.key_requests_per_min = key_requests_per_min
        self.key_tokens_per_min = key_tokens_per_min
        self.routing_policy = routing_policy
        self.target_queued = target_queued
        self.max_concurrency = max_concurrency
        self.queue_max_depth = queue_max_depth
        self.queue_max_wait_s = queue_max_wait_s
        self.ray_cluster = ray_cluster
        self.pipeline_parallel = pipeline_parallel
        self.tensor_parallel = tensor_parallel

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointCreate:
        return cls(
            cluster=data['cluster'],
            node=data.get('node'),
            model_id=data['model_id'],
            revision=data.get('revision'),
            gpus=data.get('gpus'),
            min_vram_mb=data.get('min_vram_mb'),
            public=data.get('public'),
            min_replicas=data.get('min_replicas'),
            max_replicas=data.get('max_replicas'),
            target_requests_per_min=data.get('target_requests_per_min'),
            target_in_flight=data.get('target_in_flight'),
            target_tokens_per_s=data.get('target_tokens_per_s'),
            scale_cooldown_s=data.get('scale_cooldown_s'),
            idle_timeout_s=data.get('idle_timeout_s'),
            server_args=data.get('server_args'),
            key_requests_per_min=data.get('key_requests_per_min'),
            key_tokens_per_min=data.get('key_tokens_per_min'),
            routing_policy=data.get('routing_policy'),
            target_queued=data.get('target_queued'),
            max_concurrency=data.get('max_concurrency'),
            queue_max_depth=data.get('queue_max_depth'),
            queue_max_wait_s=data.get('queue_max_wait_s'),
            ray_cluster=data.get('ray_cluster'),
            pipeline_parallel=data.get('pipeline_parallel'),
            tensor_parallel=data.get('tensor_parallel'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['cluster'] = self.cluster
        if self.node is not None:
            out['node'] = self.node
        out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        if self.gpus is not None:
            out['gpus'] = self.gpus
        if self.min_vram_mb is not None:
            out['min_vram_mb'] = self.min_vram_mb
        if self.public is not None:
            out['public'] = self.public
        if self.min_replicas is not None:
            out['min_replicas'] = self.min_replicas
        if self.max_replicas is not None:
            out['max_replicas'] = self.max_replicas
        if self.target_requests_per_min is not None:
            out['target_requests_per_min'] = self.target_requests_per_min
        if self.target_in_flight is not None:
            out['target_in_flight'] = self.target_in_flight
        if self.target_tokens_per_s is not None:
            out['target_tokens_per_s'] = self.target_tokens_per_s
        if self.scale_cooldown_s is not None:
            out['scale_cooldown_s'] = self.scale_cooldown_s
        if self.idle_timeout_s is not None:
            out['idle_timeout_s'] = self.idle_timeout_s
        if self.server_args is not None:
            out['server_args'] = self.server_args
        if self.key_requests_per_min is not None:
            out['key_requests_per_min'] = self.key_requests_per_min
        if self.key_tokens_per_min is not None:
            out['key_tokens_per_min'] = self.key_tokens_per_min
        if self.routing_policy is not None:
            out['routing_policy'] = self.routing_policy
        if self.target_queued is not None:
            out['target_queued'] = self.target_queued
        if self.max_concurrency is not None:
            out['max_concurrency'] = self.max_concurrency
        if self.queue_max_depth is not None:
            out['queue_max_depth'] = self.queue_max_depth
        if self.queue_max_wait_s is not None:
            out['queue_max_wait_s'] = self.queue_max_wait_s
        if self.ray_cluster is not None:
            out['ray_cluster'] = self.ray_cluster
        if self.pipeline_parallel is not None:
            out['pipeline_parallel'] = self.pipeline_parallel
        if self.tensor_parallel is not None:
            out['tensor_parallel'] = self.tensor_parallel
        return out


class EndpointEvent(_Model):
    """One line of an endpoint's event log (replicas starting, failing, replaced; the autoscaler's decisions)."""

    __slots__ = ('id', 'kind', 'message', 'data', 'node', 'node_name', 'command', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        kind: str,
        message: str,
        data: Any,
        node: str | None,
        node_name: str,
        command: str | None,
        created_at: str,
    ) -> None:
        self.id = id
        self.kind = kind
        self.message = message
        self.data = data
        self.node = node
        self.node_name = node_name
        self.command = command
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointEvent:
        return cls(
            id=data['id'],
            kind=data['kind'],
            message=data['message'],
            data=data['data'],
            node=data['node'],
            node_name=data['node_name'],
            command=data['command'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['kind'] = self.kind
        out['message'] = self.message
        out['data'] = self.data
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['command'] = self.command
        out['created_at'] = self.created_at
        return out


class EndpointEventPage(_Model):
    """A page of rows (`limit`/`offset`); `next`/`previous` link the neighbouring pages."""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None,
        previous: str | None,
        results: list[EndpointEvent],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointEventPage:
        return cls(
            count=data['count'],
            next=data['next'],
            previous=data['previous'],
            results=_list(EndpointEvent.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        out['next'] = self.next
        out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class EndpointGroup(_Model):
    """One rank's place in a multi-node endpoint (`agent.workloads.distributed`): vLLM split into `pipeline_parallel` stages across `nnodes` nodes, `tensor_parallel` GPUs within each. The leader (node_rank 0) serves the OpenAI API; a follower runs vLLM headless and joins the leader's torch.distributed group at `master_addr`:`master_port`. `backend` "mp" is vLLM's own multi-node executor (each node runs its rank: CPU and GPU); "ray" is vLLM's Ray executor, started on the leader only (Ray places the other ranks), which vLLM supports on GPU platforms only. The default is one node."""

    __slots__ = ('pipeline_parallel', 'tensor_parallel', 'nnodes', 'node_rank', 'master_addr', 'master_port', 'role', 'backend', 'container',)

    def __init__(
        self,
        *,
        pipeline_parallel: int | None = None,
        tensor_parallel: int | None = None,
        nnodes: int | None = None,
        node_rank: int | None = None,
        master_addr: Any = None,
        master_port: int | None = None,
        role: EndpointGroupRoleEnum | None = None,
        backend: BackendEnum | None = None,
        container: Any = None,
    ) -> None:
        self.pipeline_parallel = pipeline_parallel
        self.tensor_parallel = tensor_parallel
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.master_addr = master_addr
        self.master_port = master_port
        self.role = role
        self.backend = backend
        self.container = container

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointGroup:
        return cls(
            pipeline_parallel=data.get('pipeline_parallel'),
            tensor_parallel=data.get('tensor_parallel'),
            nnodes=data.get('nnodes'),
            node_rank=data.get('node_rank'),
            master_addr=data.get('master_addr'),
            master_port=data.get('master_port'),
            role=data.get('role'),
            backend=data.get('backend'),
            container=data.get('container'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.pipeline_parallel is not None:
            out['pipeline_parallel'] = self.pipeline_parallel
        if self.tensor_parallel is not None:
            out['tensor_parallel'] = self.tensor_parallel
        if self.nnodes is not None:
            out['nnodes'] = self.nnodes
        if self.node_rank is not None:
            out['node_rank'] = self.node_rank
        if self.master_addr is not None:
            out['master_addr'] = self.master_addr
        if self.master_port is not None:
            out['master_port'] = self.master_port
        if self.role is not None:
            out['role'] = self.role
        if self.backend is not None:
            out['backend'] = self.backend
        if self.container is not None:
            out['container'] = self.container
        return out


class EndpointLimits(_Model):
    """Input of POST /endpoints/<id>/limits/: the per-key limits (null: no limit; left out: kept)."""

    __slots__ = ('key_requests_per_min', 'key_tokens_per_min',)

    def __init__(
        self,
        *,
        key_requests_per_min: int | None = None,
        key_tokens_per_min: int | None = None,
    ) -> None:
        self.key_requests_per_min = key_requests_per_min
        self.key_tokens_per_min = key_tokens_per_min

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointLimits:
        return cls(
            key_requests_per_min=data.get('key_requests_per_min'),
            key_tokens_per_min=data.get('key_tokens_per_min'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key_requests_per_min is not None:
            out['key_requests_per_min'] = self.key_requests_per_min
        if self.key_tokens_per_min is not None:
            out['key_tokens_per_min'] = self.key_tokens_per_min
        return out


class EndpointReplica(_Model):
    """One replica of an endpoint: its server on a node, its requests in flight and completion tokens per second summed over every web process (`fleet.replica_load`, a few seconds old at most; null when they cannot be read); the requests the router sent it and, of those, its affinity hits (a request whose session or prefix key went to this same replica the time before: an estimate of prefix-cache reuse), counted by the web processes alive now; `replacement_of` names the lost replica it took over from (every replica is listed, retired ones too). A distributed endpoint's replicas are its group's ranks: `group_rank` (0 the leader), `group_role`, and the Ray node each runs on with its state now (`ray_node_label`, `ray_node_status`)."""

    __slots__ = ('id', 'server_id', 'node', 'node_name', 'status', 'port', 'failure_code', 'failure_message', 'adapters', 'in_flight', 'tokens_per_s', 'requests_routed', 'affinity_hits', 'decision_p50_us', 'decision_p99_us', 'replacement_of', 'group_rank', 'group_role', 'ray_node', 'ray_node_label', 'ray_node_status', 'created_at', 'updated_at',)

    def __init__(
        self,
        *,
        id: str,
        server_id: str,
        node: str | None,
        node_name: str,
        status: StatusFa2Enum,
        port: int,
        failure_code: str,
        failure_message: str,
        adapters: list[str],
        in_flight: int | None,
        tokens_per_s: float | None,
        requests_routed: int | None,
        affinity_hits: int | None,
        decision_p50_us: float | None,
        decision_p99_us: float | None,
        replacement_of: str | None,
        group_rank: int | None,
        group_role: str,
        ray_node: str,
        ray_node_label: str | None,
        ray_node_status: str | None,
        created_at: str,
        updated_at: str,
    ) -> None:
        self.id = id
        self.server_id = server_id
        self.node = node
        self.node_name = node_name
        self.status = status
        self.port = port
        self.failure_code = failure_code
        self.failure_message = failure_message
        self.adapters = adapters
        self.in_flight = in_flight
        self.tokens_per_s = tokens_per_s
        self.requests_routed = requests_routed
        self.affinity_hits = affinity_hits
        self.decision_p50_us = decision_p50_us
        self.decision_p99_us = decision_p99_us
        self.replacement_of = replacement_of
        self.group_rank = group_rank
        self.group_role = group_role
        self.ray_node = ray_node
        self.ray_node_label = ray_node_label
        self.ray_node_status = ray_node_status
        self.created_at = created_at
        self.updated_at = updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointReplica:
        return cls(
            id=data['id'],
            server_id=data['server_id'],
            node=data['node'],
            node_name=data['node_name'],
            status=data['status'],
            port=data['port'],
            failure_code=data['failure_code'],
            failure_message=data['failure_message'],
            adapters=data['adapters'],
            in_flight=data['in_flight'],
            tokens_per_s=data['tokens_per_s'],
            requests_routed=data['requests_routed'],
            affinity_hits=data['affinity_hits'],
            decision_p50_us=data['decision_p50_us'],
            decision_p99_us=data['decision_p99_us'],
            replacement_of=data['replacement_of'],
            group_rank=data['group_rank'],
            group_role=data['group_role'],
            ray_node=data['ray_node'],
            ray_node_label=data['ray_node_label'],
            ray_node_status=data['ray_node_status'],
            created_at=data['created_at'],
            updated_at=data['updated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['server_id'] = self.server_id
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['status'] = self.status
        out['port'] = self.port
        out['failure_code'] = self.failure_code
        out['failure_message'] = self.failure_message
        out['adapters'] = self.adapters
        out['in_flight'] = self.in_flight
        out['tokens_per_s'] = self.tokens_per_s
        out['requests_routed'] = self.requests_routed
        out['affinity_hits'] = self.affinity_hits
        out['decision_p50_us'] = self.decision_p50_us
        out['decision_p99_us'] = self.decision_p99_us
        out['replacement_of'] = self.replacement_of
        out['group_rank'] = self.group_rank
        out['group_role'] = self.group_role
        out['ray_node'] = self.ray_node
        out['ray_node_label'] = self.ray_node_label
        out['ray_node_status'] = self.ray_node_status
        out['created_at'] = self.created_at
        out['updated_at'] = self.updated_at
        return out


class EndpointRevision(_Model):
    """Input of POST /endpoints/<id>/update_revision/ (the revision alone; `update/` takes more)."""

    __slots__ = ('revision',)

    def __init__(
        self,
        *,
        revision: str,
    ) -> None:
        self.revision = revision

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointRevision:
        return cls(
            revision=data['revision'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['revision'] = self.revision
        return out


class EndpointStartCommand(_Model):
    """A `endpoint.start` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: EndpointStartCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: EndpointStartPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointStartCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(EndpointStartPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class EndpointStartPayload(_Model):
    """endpoint.start: serve a cached model with an OpenAI-compatible server. The API makes `endpoint_id` up when left out (a new endpoint); the same id restarts a stopped one."""

    __slots__ = ('endpoint_id', 'model_id', 'revision', 'port', 'gpus', 'min_vram_mb', 'extra_args', 'adapters', 'download', 'group', 'secret_fields',)

    def __init__(
        self,
        *,
        endpoint_id: str | None = None,
        model_id: str,
        revision: str | None = None,
        port: int | None = None,
        gpus: int | None = None,
        min_vram_mb: int | None = None,
        extra_args: list[str] | None = None,
        adapters: list[LoraAdapterRef] | None = None,
        download: bool | None = None,
        group: EndpointGroup | None = None,
        secret_fields: list[EndpointStartPayloadSecretFieldsEnum] | None = None,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.model_id = model_id
        self.revision = revision
        self.port = port
        self.gpus = gpus
        self.min_vram_mb = min_vram_mb
        self.extra_args = extra_args
        self.adapters = adapters
        self.download = download
        self.group = group
        self.secret_fields = secret_fields

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointStartPayload:
        return cls(
            endpoint_id=data.get('endpoint_id'),
            model_id=data['model_id'],
            revision=data.get('revision'),
            port=data.get('port'),
            gpus=data.get('gpus'),
            min_vram_mb=data.get('min_vram_mb'),
            extra_args=data.get('extra_args'),
            adapters=_list(LoraAdapterRef.from_dict, data.get('adapters')),
            download=data.get('download'),
            group=_opt(EndpointGroup.from_dict, data.get('group')),
            secret_fields=data.get('secret_fields'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.endpoint_id is not None:
            out['endpoint_id'] = self.endpoint_id
        out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        if self.port is not None:
            out['port'] = self.port
        if self.gpus is not None:
            out['gpus'] = self.gpus
        if self.min_vram_mb is not None:
            out['min_vram_mb'] = self.min_vram_mb
        if self.extra_args is not None:
            out['extra_args'] = self.extra_args
        if self.adapters is not None:
            out['adapters'] = _list(_dump, self.adapters)
        if self.download is not None:
            out['download'] = self.download
        if self.group is not None:
            out['group'] = _opt(_dump, self.group)
        if self.secret_fields is not None:
            out['secret_fields'] = self.secret_fields
        return out


class EndpointStopCommand(_Model):
    """A `endpoint.stop` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: EndpointStopCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: EndpointStopPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointStopCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(EndpointStopPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class EndpointStopPayload(_Model):
    """endpoint.stop."""

    __slots__ = ('endpoint_id',)

    def __init__(
        self,
        *,
        endpoint_id: str,
    ) -> None:
        self.endpoint_id = endpoint_id

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointStopPayload:
        return cls(
            endpoint_id=data['endpoint_id'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['endpoint_id'] = self.endpoint_id
        return out


class EndpointUpdate(_Model):
    """Input of POST /endpoints/<id>/update/: the new revision and/or server arguments (a rolling update), and/or the routing policy (at once, no restart); what is left out is kept."""

    __slots__ = ('revision', 'server_args', 'routing_policy',)

    def __init__(
        self,
        *,
        revision: str | None = None,
        server_args: list[str] | None = None,
        routing_policy: RoutingPolicyEnum | None = None,
    ) -> None:
        self.revision = revision
        self.server_args = server_args
        self.routing_policy = routing_policy

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndpointUpdate:
        return cls(
            revision=data.get('revision'),
            server_args=data.get('server_args'),
            routing_policy=data.get('routing_policy'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.revision is not None:
            out['revision'] = self.revision
        if self.server_args is not None:
            out['server_args'] = self.server_args
        if self.routing_policy is not None:
            out['routing_policy'] = self.routing_policy
        return out


class Error(_Model):
    """Why the request was refused."""

    __slots__ = ('detail', 'code', 'error_help',)

    def __init__(
        self,
        *,
        detail: str,
        code: str | None = None,
        error_help: dict[str, str] | None = None,
    ) -> None:
        self.detail = detail
        self.code = code
        self.error_help = error_help

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Error:
        return cls(
            detail=data['detail'],
            code=data.get('code'),
            error_help=data.get('error_help'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['detail'] = self.detail
        if self.code is not None:
            out['code'] = self.code
        if self.error_help is not None:
            out['error_help'] = self.error_help
        return out


class FieldErrors(_Model):
    """Field errors: each key names a field (`payload.<name>` for a command payload's fields, `non_field_errors` for the body as a whole, the parameter for a bad query value) and holds its messages. A body that is not valid JSON answers `{"detail": "JSON parse error - ..."}`."""

    __slots__ = ('extra',)

    def __init__(
        self,
        *,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.extra = extra

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FieldErrors:
        return cls(extra=dict(data))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.extra or {})


class JoinToken(_Model):
    """The one-time answer of POST /clusters/{id}/join-tokens."""

    __slots__ = ('id', 'token', 'join_command', 'expires_at',)

    def __init__(
        self,
        *,
        id: str,
        token: str,
        join_command: str,
        expires_at: str,
    ) -> None:
        self.id = id
        self.token = token
        self.join_command = join_command
        self.expires_at = expires_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JoinToken:
        return cls(
            id=data['id'],
            token=data['token'],
            join_command=data['join_command'],
            expires_at=data['expires_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['token'] = self.token
        out['join_command'] = self.join_command
        out['expires_at'] = self.expires_at
        return out


class LoraAdapter(_Model):
    """A LoRA adapter of a workspace and the endpoints (ids) it is attached to."""

    __slots__ = ('id', 'workspace', 'name', 'model_id', 'revision', 'path', 'endpoints', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        workspace: str,
        name: str,
        model_id: str,
        revision: str,
        path: str,
        endpoints: list[str],
        created_at: str,
    ) -> None:
        self.id = id
        self.workspace = workspace
        self.name = name
        self.model_id = model_id
        self.revision = revision
        self.path = path
        self.endpoints = endpoints
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraAdapter:
        return cls(
            id=data['id'],
            workspace=data['workspace'],
            name=data['name'],
            model_id=data['model_id'],
            revision=data['revision'],
            path=data['path'],
            endpoints=data['endpoints'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['workspace'] = self.workspace
        out['name'] = self.name
        out['model_id'] = self.model_id
        out['revision'] = self.revision
        out['path'] = self.path
        out['endpoints'] = self.endpoints
        out['created_at'] = self.created_at
        return out


class LoraAdapterCreate(_Model):
    """Input of POST /adapters/: a Hub repository (`model_id`, `revision`) or an absolute `path` on the nodes."""

    __slots__ = ('workspace', 'name', 'model_id', 'revision', 'path',)

    def __init__(
        self,
        *,
        workspace: str,
        name: str,
        model_id: str | None = None,
        revision: str | None = None,
        path: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.name = name
        self.model_id = model_id
        self.revision = revision
        self.path = path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraAdapterCreate:
        return cls(
            workspace=data['workspace'],
            name=data['name'],
            model_id=data.get('model_id'),
            revision=data.get('revision'),
            path=data.get('path'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['name'] = self.name
        if self.model_id is not None:
            out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        if self.path is not None:
            out['path'] = self.path
        return out


class LoraAdapterRef(_Model):
    """A LoRA adapter an endpoint's server loads: `name` is what requests put in `model`; its weights are a Hub repository (`model_id`@`revision`, fetched into the node's model cache when missing) or, when `path` is set, an absolute directory on the node."""

    __slots__ = ('name', 'model_id', 'revision', 'path',)

    def __init__(
        self,
        *,
        name: str,
        model_id: Any = None,
        revision: str | None = None,
        path: Any = None,
    ) -> None:
        self.name = name
        self.model_id = model_id
        self.revision = revision
        self.path = path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraAdapterRef:
        return cls(
            name=data['name'],
            model_id=data.get('model_id'),
            revision=data.get('revision'),
            path=data.get('path'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        if self.model_id is not None:
            out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        if self.path is not None:
            out['path'] = self.path
        return out


class Membership(_Model):
    """A member of a workspace."""

    __slots__ = ('id', 'username', 'role', 'created_at',)

    def __init__(
        self,
        *,
        id: int,
        username: str,
        role: MembershipRoleEnum,
        created_at: str,
    ) -> None:
        self.id = id
        self.username = username
        self.role = role
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Membership:
        return cls(
            id=data['id'],
            username=data['username'],
            role=data['role'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['username'] = self.username
        out['role'] = self.role
        out['created_at'] = self.created_at
        return out


class ModelDownloadCommand(_Model):
    """A `model.download` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: ModelDownloadCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: ModelDownloadPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelDownloadCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(ModelDownloadPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class ModelDownloadPayload(_Model):
    """model.download: snapshot a Hub repository into the node cache."""

    __slots__ = ('model_id', 'revision', 'allow_patterns', 'cache_budget_bytes', 'local_path',)

    def __init__(
        self,
        *,
        model_id: str,
        revision: str | None = None,
        allow_patterns: list[str] | None = None,
        cache_budget_bytes: int | None = None,
        local_path: Any = None,
    ) -> None:
        self.model_id = model_id
        self.revision = revision
        self.allow_patterns = allow_patterns
        self.cache_budget_bytes = cache_budget_bytes
        self.local_path = local_path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelDownloadPayload:
        return cls(
            model_id=data['model_id'],
            revision=data.get('revision'),
            allow_patterns=data.get('allow_patterns'),
            cache_budget_bytes=data.get('cache_budget_bytes'),
            local_path=data.get('local_path'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        if self.allow_patterns is not None:
            out['allow_patterns'] = self.allow_patterns
        if self.cache_budget_bytes is not None:
            out['cache_budget_bytes'] = self.cache_budget_bytes
        if self.local_path is not None:
            out['local_path'] = self.local_path
        return out


class ModelEvictCommand(_Model):
    """A `model.evict` command."""

    __slots__ = ('command_type', 'node_id', 'payload',)

    def __init__(
        self,
        *,
        command_type: ModelEvictCommandCommandTypeEnum,
        node_id: str | None = None,
        payload: ModelEvictPayload,
    ) -> None:
        self.command_type = command_type
        self.node_id = node_id
        self.payload = payload

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelEvictCommand:
        return cls(
            command_type=data['command_type'],
            node_id=data.get('node_id'),
            payload=_opt(ModelEvictPayload.from_dict, data['payload']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['command_type'] = self.command_type
        if self.node_id is not None:
            out['node_id'] = self.node_id
        out['payload'] = _opt(_dump, self.payload)
        return out


class ModelEvictPayload(_Model):
    """model.evict: remove a snapshot from the node's cache (refused while an endpoint serves from it)."""

    __slots__ = ('model_id', 'revision',)

    def __init__(
        self,
        *,
        model_id: str,
        revision: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.revision = revision

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelEvictPayload:
        return cls(
            model_id=data['model_id'],
            revision=data.get('revision'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['model_id'] = self.model_id
        if self.revision is not None:
            out['revision'] = self.revision
        return out


class ModelLocation(_Model):
    """One model snapshot cached on one node."""

    __slots__ = ('id', 'model_id', 'revision', 'node', 'node_name', 'node_status', 'cluster', 'cluster_name', 'path', 'size_bytes', 'last_used_at', 'updated_at',)

    def __init__(
        self,
        *,
        id: str,
        model_id: str,
        revision: str,
        node: str,
        node_name: str,
        node_status: str,
        cluster: str,
        cluster_name: str,
        path: str,
        size_bytes: int,
        last_used_at: str | None,
        updated_at: str,
    ) -> None:
        self.id = id
        self.model_id = model_id
        self.revision = revision
        self.node = node
        self.node_name = node_name
        self.node_status = node_status
        self.cluster = cluster
        self.cluster_name = cluster_name
        self.path = path
        self.size_bytes = size_bytes
        self.last_used_at = last_used_at
        self.updated_at = updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelLocation:
        return cls(
            id=data['id'],
            model_id=data['model_id'],
            revision=data['revision'],
            node=data['node'],
            node_name=data['node_name'],
            node_status=data['node_status'],
            cluster=data['cluster'],
            cluster_name=data['cluster_name'],
            path=data['path'],
            size_bytes=data['size_bytes'],
            last_used_at=data['last_used_at'],
            updated_at=data['updated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['model_id'] = self.model_id
        out['revision'] = self.revision
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['node_status'] = self.node_status
        out['cluster'] = self.cluster
        out['cluster_name'] = self.cluster_name
        out['path'] = self.path
        out['size_bytes'] = self.size_bytes
        out['last_used_at'] = self.last_used_at
        out['updated_at'] = self.updated_at
        return out


class Namespace(_Model):
    """A namespace and the cluster it is bound to."""

    __slots__ = ('id', 'workspace', 'name', 'cluster', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        workspace: str,
        name: str,
        cluster: str | None,
        created_at: str,
    ) -> None:
        self.id = id
        self.workspace = workspace
        self.name = name
        self.cluster = cluster
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Namespace:
        return cls(
            id=data['id'],
            workspace=data['workspace'],
            name=data['name'],
            cluster=data['cluster'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['workspace'] = self.workspace
        out['name'] = self.name
        out['cluster'] = self.cluster
        out['created_at'] = self.created_at
        return out


class NamespaceCreate(_Model):
    """Input of POST /namespaces."""

    __slots__ = ('workspace', 'name', 'cluster',)

    def __init__(
        self,
        *,
        workspace: str,
        name: str,
        cluster: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.name = name
        self.cluster = cluster

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NamespaceCreate:
        return cls(
            workspace=data['workspace'],
            name=data['name'],
            cluster=data.get('cluster'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['name'] = self.name
        if self.cluster is not None:
            out['cluster'] = self.cluster
        return out


class Node(_Model):
    """A node with its facts and latest utilization; `agent_current`: its agent is the served version."""

    __slots__ = ('id', 'cluster', 'name', 'hostname', 'status', 'status_changed_at', 'connected', 'last_seen', 'disconnected_at', 'last_heartbeat_at', 'cpu_count', 'cpu_percent', 'memory_total_mb', 'memory_used_mb', 'memory_percent', 'gpu_model', 'gpu_count', 'gpus', 'vram_total_mb', 'vram_used_mb', 'gpu_utilization_percent', 'containers_count', 'agent_version', 'agent_current', 'agent_version_current', 'protocol_version', 'os', 'arch', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        cluster: str,
        name: str,
        hostname: str,
        status: NodeStatusEnum,
        status_changed_at: str,
        connected: bool,
        last_seen: str | None,
        disconnected_at: str | None,
        last_heartbeat_at: str | None,
        cpu_count: int,
        cpu_percent: float | None,
        memory_total_mb: int,
        memory_used_mb: int | None,
        memory_percent: float | None,
        gpu_model: str,
        gpu_count: int,
        gpus: Any,
        vram_total_mb: int,
        vram_used_mb: int | None,
        gpu_utilization_percent: float | None,
        containers_count: int,
        agent_version: str,
        agent_current: bool,
        agent_version_current: str,
        protocol_version: int,
        os: str,
        arch: str,
        created_at: str,
    ) -> None:
        self.id = id
        self.cluster = cluster
        self.name = name
        self.hostname = hostname
        self.status = status
        self.status_changed_at = status_changed_at
        self.connected = connected
        self.last_seen = last_seen
        self.disconnected_at = disconnected_at
        self.last_heartbeat_at = last_heartbeat_at
        self.cpu_count = cpu_count
        self.cpu_percent = cpu_percent
        self.memory_total_mb = memory_total_mb
        self.memory_used_mb = memory_used_mb
        self.memory_percent = memory_percent
        self.gpu_model = gpu_model
        self.gpu_count = gpu_count
        self.gpus = gpus
        self.vram_total_mb = vram_total_mb
        self.vram_used_mb = vram_used_mb
        self.gpu_utilization_percent = gpu_utilization_percent
        self.containers_count = containers_count
        self.agent_version = agent_version
        self.agent_current = agent_current
        self.agent_version_current = agent_version_current
        self.protocol_version = protocol_version
        self.os = os
        self.arch = arch
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Node:
        return cls(
            id=data['id'],
            cluster=data['cluster'],
            name=data['name'],
            hostname=data['hostname'],
            status=data['status'],
            status_changed_at=data['status_changed_at'],
            connected=data['connected'],
            last_seen=data['last_seen'],
            disconnected_at=data['disconnected_at'],
            last_heartbeat_at=data['last_heartbeat_at'],
            cpu_count=data['cpu_count'],
            cpu_percent=data['cpu_percent'],
            memory_total_mb=data['memory_total_mb'],
            memory_used_mb=data['memory_used_mb'],
            memory_percent=data['memory_percent'],
            gpu_model=data['gpu_model'],
            gpu_count=data['gpu_count'],
            gpus=data['gpus'],
            vram_total_mb=data['vram_total_mb'],
            vram_used_mb=data['vram_used_mb'],
            gpu_utilization_percent=data['gpu_utilization_percent'],
            containers_count=data['containers_count'],
            agent_version=data['agent_version'],
            agent_current=data['agent_current'],
            agent_version_current=data['agent_version_current'],
            protocol_version=data['protocol_version'],
            os=data['os'],
            arch=data['arch'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['cluster'] = self.cluster
        out['name'] = self.name
        out['hostname'] = self.hostname
        out['status'] = self.status
        out['status_changed_at'] = self.status_changed_at
        out['connected'] = self.connected
        out['last_seen'] = self.last_seen
        out['disconnected_at'] = self.disconnected_at
        out['last_heartbeat_at'] = self.last_heartbeat_at
        out['cpu_count'] = self.cpu_count
        out['cpu_percent'] = self.cpu_percent
        out['memory_total_mb'] = self.memory_total_mb
        out['memory_used_mb'] = self.memory_used_mb
        out['memory_percent'] = self.memory_percent
        out['gpu_model'] = self.gpu_model
        out['gpu_count'] = self.gpu_count
        out['gpus'] = self.gpus
        out['vram_total_mb'] = self.vram_total_mb
        out['vram_used_mb'] = self.vram_used_mb
        out['gpu_utilization_percent'] = self.gpu_utilization_percent
        out['containers_count'] = self.containers_count
        out['agent_version'] = self.agent_version
        out['agent_current'] = self.agent_current
        out['agent_version_current'] = self.agent_version_current
        out['protocol_version'] = self.protocol_version
        out['os'] = self.os
        out['arch'] = self.arch
        out['created_at'] = self.created_at
        return out


class NodeCache(_Model):
    """One node's model cache."""

    __slots__ = ('node', 'node_name', 'cluster', 'used_bytes', 'disk_free_bytes', 'budget_mb', 'reported_budget_bytes', 'models', 'downloads',)

    def __init__(
        self,
        *,
        node: str,
        node_name: str,
        cluster: str,
        used_bytes: int,
        disk_free_bytes: int,
        budget_mb: int,
        reported_budget_bytes: int,
        models: list[CachedModel],
        downloads: list[Download],
    ) -> None:
        self.node = node
        self.node_name = node_name
        self.cluster = cluster
        self.used_bytes = used_bytes
        self.disk_free_bytes = disk_free_bytes
        self.budget_mb = budget_mb
        self.reported_budget_bytes = reported_budget_bytes
        self.models = models
        self.downloads = downloads

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeCache:
        return cls(
            node=data['node'],
            node_name=data['node_name'],
            cluster=data['cluster'],
            used_bytes=data['used_bytes'],
            disk_free_bytes=data['disk_free_bytes'],
            budget_mb=data['budget_mb'],
            reported_budget_bytes=data['reported_budget_bytes'],
            models=_list(CachedModel.from_dict, data['models']),
            downloads=_list(Download.from_dict, data['downloads']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['cluster'] = self.cluster
        out['used_bytes'] = self.used_bytes
        out['disk_free_bytes'] = self.disk_free_bytes
        out['budget_mb'] = self.budget_mb
        out['reported_budget_bytes'] = self.reported_budget_bytes
        out['models'] = _list(_dump, self.models)
        out['downloads'] = _list(_dump, self.downloads)
        return out


class NodeEvent(_Model):
    """One line of a node's event log."""

    __slots__ = ('id', 'kind', 'message', 'data', 'command', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        kind: str,
        message: str,
        data: Any,
        command: str | None,
        created_at: str,
    ) -> None:
        self.id = id
        self.kind = kind
        self.message = message
        self.data = data
        self.command = command
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeEvent:
        return cls(
            id=data['id'],
            kind=data['kind'],
            message=data['message'],
            data=data['data'],
            command=data['command'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['kind'] = self.kind
        out['message'] = self.message
        out['data'] = self.data
        out['command'] = self.command
        out['created_at'] = self.created_at
        return out


class NodeEventPage(_Model):
    """A page of rows (`limit`/`offset`); `next`/`previous` link the neighbouring pages."""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None,
        previous: str | None,
        results: list[NodeEvent],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeEventPage:
        return cls(
            count=data['count'],
            next=data['next'],
            previous=data['previous'],
            results=_list(NodeEvent.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        out['next'] = self.next
        out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class NodeFit(_Model):
    """Whether the model fits on one node, how (GPU tensor parallel or CPU) and with what margin."""

    __slots__ = ('node', 'node_name', 'cluster', 'fits', 'device', 'tensor_parallel', 'needed_mb', 'offered_mb', 'reason', 'cached',)

    def __init__(
        self,
        *,
        node: str,
        node_name: str,
        cluster: str,
        fits: bool,
        device: str,
        tensor_parallel: int,
        needed_mb: int,
        offered_mb: int,
        reason: str,
        cached: bool,
    ) -> None:
        self.node = node
        self.node_name = node_name
        self.cluster = cluster
        self.fits = fits
        self.device = device
        self.tensor_parallel = tensor_parallel
        self.needed_mb = needed_mb
        self.offered_mb = offered_mb
        self.reason = reason
        self.cached = cached

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeFit:
        return cls(
            node=data['node'],
            node_name=data['node_name'],
            cluster=data['cluster'],
            fits=data['fits'],
            device=data['device'],
            tensor_parallel=data['tensor_parallel'],
            needed_mb=data['needed_mb'],
            offered_mb=data['offered_mb'],
            reason=data['reason'],
            cached=data['cached'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['cluster'] = self.cluster
        out['fits'] = self.fits
        out['device'] = self.device
        out['tensor_parallel'] = self.tensor_parallel
        out['needed_mb'] = self.needed_mb
        out['offered_mb'] = self.offered_mb
        out['reason'] = self.reason
        out['cached'] = self.cached
        return out


class PaginatedApiKeyList(_Model):
    """PaginatedApiKeyList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[ApiKey],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedApiKeyList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(ApiKey.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedAuditEntryList(_Model):
    """PaginatedAuditEntryList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[AuditEntry],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedAuditEntryList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(AuditEntry.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedCatalogFitList(_Model):
    """PaginatedCatalogFitList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[CatalogFit],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedCatalogFitList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(CatalogFit.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedClusterList(_Model):
    """PaginatedClusterList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Cluster],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedClusterList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Cluster.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedCommandList(_Model):
    """PaginatedCommandList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Command],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedCommandList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Command.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedContainerList(_Model):
    """PaginatedContainerList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Container],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedContainerList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Container.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedEndpointBenchmarkList(_Model):
    """PaginatedEndpointBenchmarkList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[EndpointBenchmark],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedEndpointBenchmarkList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(EndpointBenchmark.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedEndpointList(_Model):
    """PaginatedEndpointList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Endpoint],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedEndpointList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Endpoint.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedLoraAdapterList(_Model):
    """PaginatedLoraAdapterList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[LoraAdapter],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedLoraAdapterList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(LoraAdapter.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedModelLocationList(_Model):
    """PaginatedModelLocationList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[ModelLocation],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedModelLocationList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(ModelLocation.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedNamespaceList(_Model):
    """PaginatedNamespaceList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Namespace],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedNamespaceList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Namespace.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedNodeCacheList(_Model):
    """PaginatedNodeCacheList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[NodeCache],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedNodeCacheList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(NodeCache.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedNodeList(_Model):
    """PaginatedNodeList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Node],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedNodeList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Node.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedRayClusterList(_Model):
    """PaginatedRayClusterList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[RayCluster],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedRayClusterList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(RayCluster.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedServeDeploymentList(_Model):
    """PaginatedServeDeploymentList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[ServeDeployment],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedServeDeploymentList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(ServeDeployment.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedTrainingJobList(_Model):
    """PaginatedTrainingJobList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[TrainingJob],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedTrainingJobList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(TrainingJob.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedTuneExperimentList(_Model):
    """PaginatedTuneExperimentList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[TuneExperiment],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedTuneExperimentList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(TuneExperiment.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PaginatedWorkspaceList(_Model):
    """PaginatedWorkspaceList"""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None = None,
        previous: str | None = None,
        results: list[Workspace],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PaginatedWorkspaceList:
        return cls(
            count=data['count'],
            next=data.get('next'),
            previous=data.get('previous'),
            results=_list(Workspace.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        if self.next is not None:
            out['next'] = self.next
        if self.previous is not None:
            out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class PatchedClusterUpdate(_Model):
    """Input of PATCH/PUT /clusters/{id}; `mode` is accepted only unchanged."""

    __slots__ = ('name', 'description', 'argocd_server', 'argocd_token', 'git_repo_url', 'git_branch', 'mode', 'auto_update_agents',)

    def __init__(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        argocd_server: str | None = None,
        argocd_token: str | None = None,
        git_repo_url: str | None = None,
        git_branch: str | None = None,
        mode: str | None = None,
        auto_update_agents: bool | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.argocd_server = argocd_server
        self.argocd_token = argocd_token
        self.git_repo_url = git_repo_url
        self.git_branch = git_branch
        self.mode = mode
        self.auto_update_agents = auto_update_agents

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PatchedClusterUpdate:
        return cls(
            name=data.get('name'),
            description=data.get('description'),
            argocd_server=data.get('argocd_server'),
            argocd_token=data.get('argocd_token'),
            git_repo_url=data.get('git_repo_url'),
            git_branch=data.get('git_branch'),
            mode=data.get('mode'),
            auto_update_agents=data.get('auto_update_agents'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name is not None:
            out['name'] = self.name
        if self.description is not None:
            out['description'] = self.description
        if self.argocd_server is not None:
            out['argocd_server'] = self.argocd_server
        if self.argocd_token is not None:
            out['argocd_token'] = self.argocd_token
        if self.git_repo_url is not None:
            out['git_repo_url'] = self.git_repo_url
        if self.git_branch is not None:
            out['git_branch'] = self.git_branch
        if self.mode is not None:
            out['mode'] = self.mode
        if self.auto_update_agents is not None:
            out['auto_update_agents'] = self.auto_update_agents
        return out


class PatchedNamespaceBind(_Model):
    """Input of PATCH /namespaces/{id}: (re)bind to a cluster, or null to unbind."""

    __slots__ = ('cluster',)

    def __init__(
        self,
        *,
        cluster: str | None = None,
    ) -> None:
        self.cluster = cluster

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PatchedNamespaceBind:
        return cls(
            cluster=data.get('cluster'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cluster is not None:
            out['cluster'] = self.cluster
        return out


class PatchedNodeRename(_Model):
    """Input of PATCH /nodes/{id}: only the name can change."""

    __slots__ = ('name',)

    def __init__(
        self,
        *,
        name: str | None = None,
    ) -> None:
        self.name = name

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PatchedNodeRename:
        return cls(
            name=data.get('name'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name is not None:
            out['name'] = self.name
        return out


class PatchedQuotaLimits(_Model):
    """New limits (only those given change; null makes a quota unlimited; an unknown name: 400)."""

    __slots__ = ('gpus', 'vram_gib', 'cpu_cores', 'memory_gib', 'containers', 'endpoints', 'ray_clusters', 'ray_workers',)

    def __init__(
        self,
        *,
        gpus: int | None = None,
        vram_gib: float | None = None,
        cpu_cores: float | None = None,
        memory_gib: float | None = None,
        containers: int | None = None,
        endpoints: int | None = None,
        ray_clusters: int | None = None,
        ray_workers: int | None = None,
    ) -> None:
        self.gpus = gpus
        self.vram_gib = vram_gib
        self.cpu_cores = cpu_cores
        self.memory_gib = memory_gib
        self.containers = containers
        self.endpoints = endpoints
        self.ray_clusters = ray_clusters
        self.ray_workers = ray_workers

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PatchedQuotaLimits:
        return cls(
            gpus=data.get('gpus'),
            vram_gib=data.get('vram_gib'),
            cpu_cores=data.get('cpu_cores'),
            memory_gib=data.get('memory_gib'),
            containers=data.get('containers'),
            endpoints=data.get('endpoints'),
            ray_clusters=data.get('ray_clusters'),
            ray_workers=data.get('ray_workers'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.gpus is not None:
            out['gpus'] = self.gpus
        if self.vram_gib is not None:
            out['vram_gib'] = self.vram_gib
        if self.cpu_cores is not None:
            out['cpu_cores'] = self.cpu_cores
        if self.memory_gib is not None:
            out['memory_gib'] = self.memory_gib
        if self.containers is not None:
            out['containers'] = self.containers
        if self.endpoints is not None:
            out['endpoints'] = self.endpoints
        if self.ray_clusters is not None:
            out['ray_clusters'] = self.ray_clusters
        if self.ray_workers is not None:
            out['ray_workers'] = self.ray_workers
        return out


class PatchedRayClusterUpdate(_Model):
    """PATCH /ray/clusters/<id>/."""

    __slots__ = ('ray_version', 'min_workers', 'max_workers', 'idle_timeout_s', 'checkpoint_on_stop',)

    def __init__(
        self,
        *,
        ray_version: str | None = None,
        min_workers: int | None = None,
        max_workers: int | None = None,
        idle_timeout_s: int | None = None,
        checkpoint_on_stop: bool | None = None,
    ) -> None:
        self.ray_version = ray_version
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.idle_timeout_s = idle_timeout_s
        self.checkpoint_on_stop = checkpoint_on_stop

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PatchedRayClusterUpdate:
        return cls(
            ray_version=data.get('ray_version'),
            min_workers=data.get('min_workers'),
            max_workers=data.get('max_workers'),
            idle_timeout_s=data.get('idle_timeout_s'),
            checkpoint_on_stop=data.get('checkpoint_on_stop'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.ray_version is not None:
            out['ray_version'] = self.ray_version
        if self.min_workers is not None:
            out['min_workers'] = self.min_workers
        if self.max_workers is not None:
            out['max_workers'] = self.max_workers
        if self.idle_timeout_s is not None:
            out['idle_timeout_s'] = self.idle_timeout_s
        if self.checkpoint_on_stop is not None:
            out['checkpoint_on_stop'] = self.checkpoint_on_stop
        return out


class PortMapping(_Model):
    """A container port published on the host (host_port 0 = pick any free port)."""

    __slots__ = ('container_port', 'host_port', 'protocol',)

    def __init__(
        self,
        *,
        container_port: int,
        host_port: int | None = None,
        protocol: ProtocolEnum | None = None,
    ) -> None:
        self.container_port = container_port
        self.host_port = host_port
        self.protocol = protocol

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PortMapping:
        return cls(
            container_port=data['container_port'],
            host_port=data.get('host_port'),
            protocol=data.get('protocol'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['container_port'] = self.container_port
        if self.host_port is not None:
            out['host_port'] = self.host_port
        if self.protocol is not None:
            out['protocol'] = self.protocol
        return out


class PriceVersion(_Model):
    """One version of the price table (read; and the body of a new one)."""

    __slots__ = ('id', 'effective_from', 'currency', 'node_hour', 'cluster_node_hour', 'gpu_hour', 'gpu_model_hour', 'cpu_core_hour', 'memory_gib_hour', 'prompt_per_million', 'completion_per_million', 'endpoint_tokens', 'note', 'created_at',)

    def __init__(
        self,
        *,
        id: int,
        effective_from: str,
        currency: str | None = None,
        node_hour: str | None = None,
        cluster_node_hour: Any = None,
        gpu_hour: str | None = None,
        gpu_model_hour: Any = None,
        cpu_core_hour: str | None = None,
        memory_gib_hour: str | None = None,
        prompt_per_million: str | None = None,
        completion_per_million: str | None = None,
        endpoint_tokens: Any = None,
        note: str | None = None,
        created_at: str,
    ) -> None:
        self.id = id
        self.effective_from = effective_from
        self.currency = currency
        self.node_hour = node_hour
        self.cluster_node_hour = cluster_node_hour
        self.gpu_hour = gpu_hour
        self.gpu_model_hour = gpu_model_hour
        self.cpu_core_hour = cpu_core_hour
        self.memory_gib_hour = memory_gib_hour
        self.prompt_per_million = prompt_per_million
        self.completion_per_million = completion_per_million
        self.endpoint_tokens = endpoint_tokens
        self.note = note
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PriceVersion:
        return cls(
            id=data['id'],
            effective_from=data['effective_from'],
            currency=data.get('currency'),
            node_hour=data.get('node_hour'),
            cluster_node_hour=data.get('cluster_node_hour'),
            gpu_hour=data.get('gpu_hour'),
            gpu_model_hour=data.get('gpu_model_hour'),
            cpu_core_hour=data.get('cpu_core_hour'),
            memory_gib_hour=data.get('memory_gib_hour'),
            prompt_per_million=data.get('prompt_per_million'),
            completion_per_million=data.get('completion_per_million'),
            endpoint_tokens=data.get('endpoint_tokens'),
            note=data.get('note'),
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['effective_from'] = self.effective_from
        if self.currency is not None:
            out['currency'] = self.currency
        if self.node_hour is not None:
            out['node_hour'] = self.node_hour
        if self.cluster_node_hour is not None:
            out['cluster_node_hour'] = self.cluster_node_hour
        if self.gpu_hour is not None:
            out['gpu_hour'] = self.gpu_hour
        if self.gpu_model_hour is not None:
            out['gpu_model_hour'] = self.gpu_model_hour
        if self.cpu_core_hour is not None:
            out['cpu_core_hour'] = self.cpu_core_hour
        if self.memory_gib_hour is not None:
            out['memory_gib_hour'] = self.memory_gib_hour
        if self.prompt_per_million is not None:
            out['prompt_per_million'] = self.prompt_per_million
        if self.completion_per_million is not None:
            out['completion_per_million'] = self.completion_per_million
        if self.endpoint_tokens is not None:
            out['endpoint_tokens'] = self.endpoint_tokens
        if self.note is not None:
            out['note'] = self.note
        out['created_at'] = self.created_at
        return out


class QueueFigures(_Model):
    """An endpoint's wait queue over every web process: requests waiting now and its bounds; of the last window (REPLICA_LOAD_WINDOW_S, 10 s by default) the requests admitted, their wait p50/p99 (seconds, the upper bound of the bucket it falls in; 0 when admitted at once) and the requests refused with 429."""

    __slots__ = ('waiting', 'max_depth', 'max_wait_s', 'admitted', 'refused', 'wait_p50_s', 'wait_p99_s',)

    def __init__(
        self,
        *,
        waiting: int,
        max_depth: int,
        max_wait_s: float,
        admitted: int,
        refused: int,
        wait_p50_s: float | None,
        wait_p99_s: float | None,
    ) -> None:
        self.waiting = waiting
        self.max_depth = max_depth
        self.max_wait_s = max_wait_s
        self.admitted = admitted
        self.refused = refused
        self.wait_p50_s = wait_p50_s
        self.wait_p99_s = wait_p99_s

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueueFigures:
        return cls(
            waiting=data['waiting'],
            max_depth=data['max_depth'],
            max_wait_s=data['max_wait_s'],
            admitted=data['admitted'],
            refused=data['refused'],
            wait_p50_s=data['wait_p50_s'],
            wait_p99_s=data['wait_p99_s'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['waiting'] = self.waiting
        out['max_depth'] = self.max_depth
        out['max_wait_s'] = self.max_wait_s
        out['admitted'] = self.admitted
        out['refused'] = self.refused
        out['wait_p50_s'] = self.wait_p50_s
        out['wait_p99_s'] = self.wait_p99_s
        return out


class QuotaLine(_Model):
    """One quota: its limit (null: unlimited) and what the workspace has in use against it."""

    __slots__ = ('quota', 'label', 'unit', 'limit', 'in_use', 'percent',)

    def __init__(
        self,
        *,
        quota: QuotaEnum,
        label: str,
        unit: str,
        limit: float | None,
        in_use: float,
        percent: int | None,
    ) -> None:
        self.quota = quota
        self.label = label
        self.unit = unit
        self.limit = limit
        self.in_use = in_use
        self.percent = percent

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuotaLine:
        return cls(
            quota=data['quota'],
            label=data['label'],
            unit=data['unit'],
            limit=data['limit'],
            in_use=data['in_use'],
            percent=data['percent'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['quota'] = self.quota
        out['label'] = self.label
        out['unit'] = self.unit
        out['limit'] = self.limit
        out['in_use'] = self.in_use
        out['percent'] = self.percent
        return out


class Quotas(_Model):
    """A workspace's quotas and usage."""

    __slots__ = ('workspace', 'can_edit', 'quotas',)

    def __init__(
        self,
        *,
        workspace: str,
        can_edit: bool,
        quotas: list[QuotaLine],
    ) -> None:
        self.workspace = workspace
        self.can_edit = can_edit
        self.quotas = quotas

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Quotas:
        return cls(
            workspace=data['workspace'],
            can_edit=data['can_edit'],
            quotas=_list(QuotaLine.from_dict, data['quotas']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['can_edit'] = self.can_edit
        out['quotas'] = _list(_dump, self.quotas)
        return out


class RayCluster(_Model):
    """A Ray cluster as listed and inspected."""

    __slots__ = ('id', 'workspace', 'compute_cluster', 'compute_cluster_name', 'name', 'ray_version', 'runtime', 'min_workers', 'max_workers', 'idle_timeout_s', 'worker_cpus', 'worker_memory_mb', 'worker_gpus', 'checkpoint_on_stop', 'serves_vllm', 'status', 'status_changed_at', 'failure_reason', 'head_node', 'head_node_name', 'head_hostname', 'head_ip', 'head_container_id', 'gcs_port', 'head_gcs_port', 'dashboard_port', 'dashboard_url', 'created_at', 'started_at',)

    def __init__(
        self,
        *,
        id: str,
        workspace: str,
        compute_cluster: str,
        compute_cluster_name: str,
        name: str,
        ray_version: str,
        runtime: RayRuntimeEnum,
        min_workers: int,
        max_workers: int,
        idle_timeout_s: int,
        worker_cpus: float,
        worker_memory_mb: int,
        worker_gpus: int,
        checkpoint_on_stop: bool,
        serves_vllm: bool,
        status: RayClusterStatusEnum,
        status_changed_at: str,
        failure_reason: str,
        head_node: str | None,
        head_node_name: str,
        head_hostname: str,
        head_ip: str,
        head_container_id: str,
        gcs_port: int | None,
        head_gcs_port: int | None,
        dashboard_port: int,
        dashboard_url: str,
        created_at: str,
        started_at: str | None,
    ) -> None:
        self.id = id
        self.workspace = workspace
        self.compute_cluster = compute_cluster
        self.compute_cluster_name = compute_cluster_name
        self.name = name
        self.ray_version = ray_version
        self.runtime = runtime
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.idle_timeout_s = idle_timeout_s
        self.worker_cpus = worker_cpus
        self.worker_memory_mb = worker_memory_mb
        self.worker_gpus = worker_gpus
        self.checkpoint_on_stop = checkpoint_on_stop
        self.serves_vllm = serves_vllm
        self.status = status
        self.status_changed_at = status_changed_at
        self.failure_reason = failure_reason
        self.head_node = head_node
        self.head_node_name = head_node_name
        self.head_hostname = head_hostname
        self.head_ip = head_ip
        self.head_container_id = head_container_id
        self.gcs_port = gcs_port
        self.head_gcs_port = head_gcs_port
        self.dashboard_port = dashboard_port
        self.dashboard_url = dashboard_url
        self.created_at = created_at
        self.started_at = started_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayCluster:
        return cls(
            id=data['id'],
            workspace=data['workspace'],
            compute_cluster=data['compute_cluster'],
            compute_cluster_name=data['compute_cluster_name'],
            name=data['name'],
            ray_version=data['ray_version'],
            runtime=data['runtime'],
            min_workers=data['min_workers'],
            max_workers=data['max_workers'],
            idle_timeout_s=data['idle_timeout_s'],
            worker_cpus=data['worker_cpus'],
            worker_memory_mb=data['worker_memory_mb'],
            worker_gpus=data['worker_gpus'],
            checkpoint_on_stop=data['checkpoint_on_stop'],
            serves_vllm=data['serves_vllm'],
            status=data['status'],
            status_changed_at=data['status_changed_at'],
            failure_reason=data['failure_reason'],
            head_node=data['head_node'],
            head_node_name=data['head_node_name'],
            head_hostname=data['head_hostname'],
            head_ip=data['head_ip'],
            head_container_id=data['head_container_id'],
            gcs_port=data['gcs_port'],
            head_gcs_port=data['head_gcs_port'],
            dashboard_port=data['dashboard_port'],
            dashboard_url=data['dashboard_url'],
            created_at=data['created_at'],
            started_at=data['started_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['workspace'] = self.workspace
        out['compute_cluster'] = self.compute_cluster
        out['compute_cluster_name'] = self.compute_cluster_name
        out['name'] = self.name
        out['ray_version'] = self.ray_version
        out['runtime'] = self.runtime
        out['min_workers'] = self.min_workers
        out['max_workers'] = self.max_workers
        out['idle_timeout_s'] = self.idle_timeout_s
        out['worker_cpus'] = self.worker_cpus
        out['worker_memory_mb'] = self.worker_memory_mb
        out['worker_gpus'] = self.worker_gpus
        out['checkpoint_on_stop'] = self.checkpoint_on_stop
        out['serves_vllm'] = self.serves_vllm
        out['status'] = self.status
        out['status_changed_at'] = self.status_changed_at
        out['failure_reason'] = self.failure_reason
        out['head_node'] = self.head_node
        out['head_node_name'] = self.head_node_name
        out['head_hostname'] = self.head_hostname
        out['head_ip'] = self.head_ip
        out['head_container_id'] = self.head_container_id
        out['gcs_port'] = self.gcs_port
        out['head_gcs_port'] = self.head_gcs_port
        out['dashboard_port'] = self.dashboard_port
        out['dashboard_url'] = self.dashboard_url
        out['created_at'] = self.created_at
        out['started_at'] = self.started_at
        return out


class RayClusterCreate(_Model):
    """POST /ray/clusters/."""

    __slots__ = ('workspace', 'compute_cluster', 'name', 'ray_version', 'runtime', 'min_workers', 'max_workers', 'idle_timeout_s', 'gcs_port', 'dashboard_port', 'checkpoint_on_stop', 'serves_vllm', 'worker_cpus', 'worker_memory_mb', 'worker_gpus',)

    def __init__(
        self,
        *,
        workspace: str,
        compute_cluster: str,
        name: str,
        ray_version: str | None = None,
        runtime: RayRuntimeEnum | None = None,
        min_workers: int | None = None,
        max_workers: int | None = None,
        idle_timeout_s: int | None = None,
        gcs_port: int | None = None,
        dashboard_port: int | None = None,
        checkpoint_on_stop: bool | None = None,
        serves_vllm: bool | None = None,
        worker_cpus: float | None = None,
        worker_memory_mb: int | None = None,
        worker_gpus: int | None = None,
    ) -> None:
        self.workspace = workspace
        self.compute_cluster = compute_cluster
        self.name = name
        self.ray_version = ray_version
        self.runtime = runtime
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.idle_timeout_s = idle_timeout_s
        self.gcs_port = gcs_port
        self.dashboard_port = dashboard_port
        self.checkpoint_on_stop = checkpoint_on_stop
        self.serves_vllm = serves_vllm
        self.worker_cpus = worker_cpus
        self.worker_memory_mb = worker_memory_mb
        self.worker_gpus = worker_gpus

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayClusterCreate:
        return cls(
            workspace=data['workspace'],
            compute_cluster=data['compute_cluster'],
            name=data['name'],
            ray_version=data.get('ray_version'),
            runtime=data.get('runtime'),
            min_workers=data.get('min_workers'),
            max_workers=data.get('max_workers'),
            idle_timeout_s=data.get('idle_timeout_s'),
            gcs_port=data.get('gcs_port'),
            dashboard_port=data.get('dashboard_port'),
            checkpoint_on_stop=data.get('checkpoint_on_stop'),
            serves_vllm=data.get('serves_vllm'),
            worker_cpus=data.get('worker_cpus'),
            worker_memory_mb=data.get('worker_memory_mb'),
            worker_gpus=data.get('worker_gpus'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['compute_cluster'] = self.compute_cluster
        out['name'] = self.name
        if self.ray_version is not None:
            out['ray_version'] = self.ray_version
        if self.runtime is not None:
            out['runtime'] = self.runtime
        if self.min_workers is not None:
            out['min_workers'] = self.min_workers
        if self.max_workers is not None:
            out['max_workers'] = self.max_workers
        if self.idle_timeout_s is not None:
            out['idle_timeout_s'] = self.idle_timeout_s
        if self.gcs_port is not None:
            out['gcs_port'] = self.gcs_port
        if self.dashboard_port is not None:
            out['dashboard_port'] = self.dashboard_port
        if self.checkpoint_on_stop is not None:
            out['checkpoint_on_stop'] = self.checkpoint_on_stop
        if self.serves_vllm is not None:
            out['serves_vllm'] = self.serves_vllm
        if self.worker_cpus is not None:
            out['worker_cpus'] = self.worker_cpus
        if self.worker_memory_mb is not None:
            out['worker_memory_mb'] = self.worker_memory_mb
        if self.worker_gpus is not None:
            out['worker_gpus'] = self.worker_gpus
        return out


class RayClusterEvent(_Model):
    """One event of a Ray cluster."""

    __slots__ = ('id', 'kind', 'message', 'data', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        kind: str,
        message: str,
        data: Any,
        created_at: str,
    ) -> None:
        self.id = id
        self.kind = kind
        self.message = message
        self.data = data
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayClusterEvent:
        return cls(
            id=data['id'],
            kind=data['kind'],
            message=data['message'],
            data=data['data'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['kind'] = self.kind
        out['message'] = self.message
        out['data'] = self.data
        out['created_at'] = self.created_at
        return out


class RayClusterEventPage(_Model):
    """A page of rows (`limit`/`offset`); `next`/`previous` link the neighbouring pages."""

    __slots__ = ('count', 'next', 'previous', 'results',)

    def __init__(
        self,
        *,
        count: int,
        next: str | None,
        previous: str | None,
        results: list[RayClusterEvent],
    ) -> None:
        self.count = count
        self.next = next
        self.previous = previous
        self.results = results

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayClusterEventPage:
        return cls(
            count=data['count'],
            next=data['next'],
            previous=data['previous'],
            results=_list(RayClusterEvent.from_dict, data['results']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['count'] = self.count
        out['next'] = self.next
        out['previous'] = self.previous
        out['results'] = _list(_dump, self.results)
        return out


class RayNode(_Model):
    """A head or worker with its latest usage."""

    __slots__ = ('id', 'role', 'status', 'status_changed_at', 'failure_reason', 'node', 'node_name', 'hostname', 'container_id', 'ray_node_id', 'ip', 'cpu_percent', 'memory_percent', 'gpu_count', 'vram_used_mb', 'vram_total_mb', 'running_tasks', 'idle_s', 'resources', 'created_at',)

    def __init__(
        self,
        *,
        id: str,
        role: RayNodeRoleEnum,
        status: RayNodeStatusEnum,
        status_changed_at: str,
        failure_reason: str,
        node: str,
        node_name: str,
        hostname: str,
        container_id: str,
        ray_node_id: str,
        ip: str,
        cpu_percent: float,
        memory_percent: float,
        gpu_count: int,
        vram_used_mb: int,
        vram_total_mb: int,
        running_tasks: int,
        idle_s: float,
        resources: Any,
        created_at: str,
    ) -> None:
        self.id = id
        self.role = role
        self.status = status
        self.status_changed_at = status_changed_at
        self.failure_reason = failure_reason
        self.node = node
        self.node_name = node_name
        self.hostname = hostname
        self.container_id = container_id
        self.ray_node_id = ray_node_id
        self.ip = ip
        self.cpu_percent = cpu_percent
        self.memory_percent = memory_percent
        self.gpu_count = gpu_count
        self.vram_used_mb = vram_used_mb
        self.vram_total_mb = vram_total_mb
        self.running_tasks = running_tasks
        self.idle_s = idle_s
        self.resources = resources
        self.created_at = created_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayNode:
        return cls(
            id=data['id'],
            role=data['role'],
            status=data['status'],
            status_changed_at=data['status_changed_at'],
            failure_reason=data['failure_reason'],
            node=data['node'],
            node_name=data['node_name'],
            hostname=data['hostname'],
            container_id=data['container_id'],
            ray_node_id=data['ray_node_id'],
            ip=data['ip'],
            cpu_percent=data['cpu_percent'],
            memory_percent=data['memory_percent'],
            gpu_count=data['gpu_count'],
            vram_used_mb=data['vram_used_mb'],
            vram_total_mb=data['vram_total_mb'],
            running_tasks=data['running_tasks'],
            idle_s=data['idle_s'],
            resources=data['resources'],
            created_at=data['created_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['role'] = self.role
        out['status'] = self.status
        out['status_changed_at'] = self.status_changed_at
        out['failure_reason'] = self.failure_reason
        out['node'] = self.node
        out['node_name'] = self.node_name
        out['hostname'] = self.hostname
        out['container_id'] = self.container_id
        out['ray_node_id'] = self.ray_node_id
        out['ip'] = self.ip
        out['cpu_percent'] = self.cpu_percent
        out['memory_percent'] = self.memory_percent
        out['gpu_count'] = self.gpu_count
        out['vram_used_mb'] = self.vram_used_mb
        out['vram_total_mb'] = self.vram_total_mb
        out['running_tasks'] = self.running_tasks
        out['idle_s'] = self.idle_s
        out['resources'] = self.resources
        out['created_at'] = self.created_at
        return out


class ServeDeployment(_Model):
    """A Serve deployment as read; `proxy_url` reaches it through the tunnel proxy on its own origin, `endpoint_url` on the node."""

    __slots__ = ('id', 'proxy_url', 'name', 'created_at', 'status_changed_at', 'failure_reason', 'last_status', 'last_status_at', 'engine', 'model', 'checkpoint_path', 'code', 'route_prefix', 'http_port', 'num_replicas', 'autoscaling', 'min_replicas', 'max_replicas', 'target_ongoing_requests', 'cpus_per_replica', 'gpus_per_replica', 'status', 'submission_id', 'endpoint_url', 'replica_logs', 'workspace', 'created_by', 'ray_cluster', 'checkpoint_job',)

    def __init__(
        self,
        *,
        id: str,
        proxy_url: str,
        name: str,
        created_at: str,
        status_changed_at: str,
        failure_reason: str,
        last_status: Any,
        last_status_at: str | None,
        engine: EngineEnum,
        model: str,
        checkpoint_path: str,
        code: str,
        route_prefix: str,
        http_port: int,
        num_replicas: int,
        autoscaling: bool,
        min_replicas: int,
        max_replicas: int,
        target_ongoing_requests: float,
        cpus_per_replica: float,
        gpus_per_replica: float,
        status: ServeDeploymentStatusEnum,
        submission_id: str,
        endpoint_url: str,
        replica_logs: Any,
        workspace: str,
        created_by: int | None,
        ray_cluster: str,
        checkpoint_job: str | None,
    ) -> None:
        self.id = id
        self.proxy_url = proxy_url
        self.name = name
        self.created_at = created_at
        self.status_changed_at = status_changed_at
        self.failure_reason = failure_reason
        self.last_status = last_status
        self.last_status_at = last_status_at
        self.engine = engine
        self.model = model
        self.checkpoint_path = checkpoint_path
        self.code = code
        self.route_prefix = route_prefix
        self.http_port = http_port
        self.num_replicas = num_replicas
        self.autoscaling = autoscaling
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.target_ongoing_requests = target_ongoing_requests
        self.cpus_per_replica = cpus_per_replica
        self.gpus_per_replica = gpus_per_replica
        self.status = status
        self.submission_id = submission_id
        self.endpoint_url = endpoint_url
        self.replica_logs = replica_logs
        self.workspace = workspace
        self.created_by = created_by
        self.ray_cluster = ray_cluster
        self.checkpoint_job = checkpoint_job

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeDeployment:
        return cls(
            id=data['id'],
            proxy_url=data['proxy_url'],
            name=data['name'],
            created_at=data['created_at'],
            status_changed_at=data['status_changed_at'],
            failure_reason=data['failure_reason'],
            last_status=data['last_status'],
            last_status_at=data['last_status_at'],
            engine=data['engine'],
            model=data['model'],
            checkpoint_path=data['checkpoint_path'],
            code=data['code'],
            route_prefix=data['route_prefix'],
            http_port=data['http_port'],
            num_replicas=data['num_replicas'],
            autoscaling=data['autoscaling'],
            min_replicas=data['min_replicas'],
            max_replicas=data['max_replicas'],
            target_ongoing_requests=data['target_ongoing_requests'],
            cpus_per_replica=data['cpus_per_replica'],
            gpus_per_replica=data['gpus_per_replica'],
            status=data['status'],
            submission_id=data['submission_id'],
            endpoint_url=data['endpoint_url'],
            replica_logs=data['replica_logs'],
            workspace=data['workspace'],
            created_by=data['created_by'],
            ray_cluster=data['ray_cluster'],
            checkpoint_job=data['checkpoint_job'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['proxy_url'] = self.proxy_url
        out['name'] = self.name
        out['created_at'] = self.created_at
        out['status_changed_at'] = self.status_changed_at
        out['failure_reason'] = self.failure_reason
        out['last_status'] = self.last_status
        out['last_status_at'] = self.last_status_at
        out['engine'] = self.engine
        out['model'] = self.model
        out['checkpoint_path'] = self.checkpoint_path
        out['code'] = self.code
        out['route_prefix'] = self.route_prefix
        out['http_port'] = self.http_port
        out['num_replicas'] = self.num_replicas
        out['autoscaling'] = self.autoscaling
        out['min_replicas'] = self.min_replicas
        out['max_replicas'] = self.max_replicas
        out['target_ongoing_requests'] = self.target_ongoing_requests
        out['cpus_per_replica'] = self.cpus_per_replica
        out['gpus_per_replica'] = self.gpus_per_replica
        out['status'] = self.status
        out['submission_id'] = self.submission_id
        out['endpoint_url'] = self.endpoint_url
        out['replica_logs'] = self.replica_logs
        out['workspace'] = self.workspace
        out['created_by'] = self.created_by
        out['ray_cluster'] = self.ray_cluster
        out['checkpoint_job'] = self.checkpoint_job
        return out


class ServeDeploymentCreate(_Model):
    """POST deployments/."""

    __slots__ = ('workspace', 'ray_cluster', 'name', 'engine', 'model', 'checkpoint_job', 'checkpoint_path', 'code', 'route_prefix', 'http_port', 'num_replicas', 'autoscaling', 'min_replicas', 'max_replicas', 'target_ongoing_requests', 'cpus_per_replica', 'gpus_per_replica',)

    def __init__(
        self,
        *,
        workspace: str,
        ray_cluster: str,
        name: str,
        engine: str | None = None,
        model: str | None = None,
        checkpoint_job: str | None = None,
        checkpoint_path: str | None = None,
        code: str | None = None,
        route_prefix: str | None = None,
        http_port: int | None = None,
        num_replicas: int | None = None,
        autoscaling: bool | None = None,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        target_ongoing_requests: float | None = None,
        cpus_per_replica: float | None = None,
        gpus_per_replica: float | None = None,
    ) -> None:
        self.workspace = workspace
        self.ray_cluster = ray_cluster
        self.name = name
        self.engine = engine
        self.model = model
        self.checkpoint_job = checkpoint_job
        self.checkpoint_path = checkpoint_path
        self.code = code
        self.route_prefix = route_prefix
        self.http_port = http_port
        self.num_replicas = num_replicas
        self.autoscaling = autoscaling
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.target_ongoing_requests = target_ongoing_requests
        self.cpus_per_replica = cpus_per_replica
        self.gpus_per_replica = gpus_per_replica

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeDeploymentCreate:
        return cls(
            workspace=data['workspace'],
            ray_cluster=data['ray_cluster'],
            name=data['name'],
            engine=data.get('engine'),
            model=data.get('model'),
            checkpoint_job=data.get('checkpoint_job'),
            checkpoint_path=data.get('checkpoint_path'),
            code=data.get('code'),
            route_prefix=data.get('route_prefix'),
            http_port=data.get('http_port'),
            num_replicas=data.get('num_replicas'),
            autoscaling=data.get('autoscaling'),
            min_replicas=data.get('min_replicas'),
            max_replicas=data.get('max_replicas'),
            target_ongoing_requests=data.get('target_ongoing_requests'),
            cpus_per_replica=data.get('cpus_per_replica'),
            gpus_per_replica=data.get('gpus_per_replica'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['ray_cluster'] = self.ray_cluster
        out['name'] = self.name
        if self.engine is not None:
            out['engine'] = self.engine
        if self.model is not None:
            out['model'] = self.model
        if self.checkpoint_job is not None:
            out['checkpoint_job'] = self.checkpoint_job
        if self.checkpoint_path is not None:
            out['checkpoint_path'] = self.checkpoint_path
        if self.code is not None:
            out['code'] = self.code
        if self.route_prefix is not None:
            out['route_prefix'] = self.route_prefix
        if self.http_port is not None:
            out['http_port'] = self.http_port
        if self.num_replicas is not None:
            out['num_replicas'] = self.num_replicas
        if self.autoscaling is not None:
            out['autoscaling'] = self.autoscaling
        if self.min_replicas is not None:
            out['min_replicas'] = self.min_replicas
        if self.max_replicas is not None:
            out['max_replicas'] = self.max_replicas
        if self.target_ongoing_requests is not None:
            out['target_ongoing_requests'] = self.target_ongoing_requests
        if self.cpus_per_replica is not None:
            out['cpus_per_replica'] = self.cpus_per_replica
        if self.gpus_per_replica is not None:
            out['gpus_per_replica'] = self.gpus_per_replica
        return out


class TrainWithBest(_Model):
    """POST tune-experiments/<id>/train/."""

    __slots__ = ('name', 'storage_path',)

    def __init__(
        self,
        *,
        name: str,
        storage_path: str | None = None,
    ) -> None:
        self.name = name
        self.storage_path = storage_path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainWithBest:
        return cls(
            name=data['name'],
            storage_path=data.get('storage_path'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['name'] = self.name
        if self.storage_path is not None:
            out['storage_path'] = self.storage_path
        return out


class TrainingJob(_Model):
    """A training job as read."""

    __slots__ = ('id', 'queue_position', 'hints', 'status_sentence', 'priority', 'queue_timeout_s', 'queue_reason', 'name', 'created_at', 'status_changed_at', 'failure_reason', 'last_status_at', 'kind', 'script', 'entrypoint', 'framework', 'config', 'num_workers', 'cpus_per_worker', 'gpus_per_worker', 'checkpoint_every', 'checkpoints_to_keep', 'storage_path', 'status', 'submission_id', 'submitted_at', 'finished_at', 'cancel_requested', 'logs', 'traceback', 'checkpoints', 'workspace', 'created_by', 'ray_cluster', 'source_experiment',)

    def __init__(
        self,
        *,
        id: str,
        queue_position: int | None,
        hints: list[dict[str, str]],
        status_sentence: str,
        priority: int,
        queue_timeout_s: int | None,
        queue_reason: str,
        name: str,
        created_at: str,
        status_changed_at: str,
        failure_reason: str,
        last_status_at: str | None,
        kind: KindEnum,
        script: str,
        entrypoint: str,
        framework: FrameworkEnum,
        config: Any,
        num_workers: int,
        cpus_per_worker: float,
        gpus_per_worker: float,
        checkpoint_every: int,
        checkpoints_to_keep: int,
        storage_path: str,
        status: JobStatusEnum,
        submission_id: str,
        submitted_at: str | None,
        finished_at: str | None,
        cancel_requested: bool,
        logs: str,
        traceback: str,
        checkpoints: Any,
        workspace: str,
        created_by: int | None,
        ray_cluster: str,
        source_experiment: str | None,
    ) -> None:
        self.id = id
        self.queue_position = queue_position
        self.hints = hints
        self.status_sentence = status_sentence
        self.priority = priority
        self.queue_timeout_s = queue_timeout_s
        self.queue_reason = queue_reason
        self.name = name
        self.created_at = created_at
        self.status_changed_at = status_changed_at
        self.failure_reason = failure_reason
        self.last_status_at = last_status_at
        self.kind = kind
        self.script = script
        self.entrypoint = entrypoint
        self.framework = framework
        self.config = config
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.checkpoint_every = checkpoint_every
        self.checkpoints_to_keep = checkpoints_to_keep
        self.storage_path = storage_path
        self.status = status
        self.submission_id = submission_id
        self.submitted_at = submitted_at
        self.finished_at = finished_at
        self.cancel_requested = cancel_requested
        self.logs = logs
        self.traceback = traceback
        self.checkpoints = checkpoints
        self.workspace = workspace
        self.created_by = created_by
        self.ray_cluster = ray_cluster
        self.source_experiment = source_experiment

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingJob:
        return cls(
            id=data['id'],
            queue_position=data['queue_position'],
            hints=data['hints'],
            status_sentence=data['status_sentence'],
            priority=data['priority'],
            queue_timeout_s=data['queue_timeout_s'],
            queue_reason=data['queue_reason'],
            name=data['name'],
            created_at=data['created_at'],
            status_changed_at=data['status_changed_at'],
            failure_reason=data['failure_reason'],
            last_status_at=data['last_status_at'],
            kind=data['kind'],
            script=data['script'],
            entrypoint=data['entrypoint'],
            framework=data['framework'],
            config=data['config'],
            num_workers=data['num_workers'],
            cpus_per_worker=data['cpus_per_worker'],
            gpus_per_worker=data['gpus_per_worker'],
            checkpoint_every=data['checkpoint_every'],
            checkpoints_to_keep=data['checkpoints_to_keep'],
            storage_path=data['storage_path'],
            status=data['status'],
            submission_id=data['submission_id'],
            submitted_at=data['submitted_at'],
            finished_at=data['finished_at'],
            cancel_requested=data['cancel_requested'],
            logs=data['logs'],
            traceback=data['traceback'],
            checkpoints=data['checkpoints'],
            workspace=data['workspace'],
            created_by=data['created_by'],
            ray_cluster=data['ray_cluster'],
            source_experiment=data['source_experiment'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['queue_position'] = self.queue_position
        out['hints'] = self.hints
        out['status_sentence'] = self.status_sentence
        out['priority'] = self.priority
        out['queue_timeout_s'] = self.queue_timeout_s
        out['queue_reason'] = self.queue_reason
        out['name'] = self.name
        out['created_at'] = self.created_at
        out['status_changed_at'] = self.status_changed_at
        out['failure_reason'] = self.failure_reason
        out['last_status_at'] = self.last_status_at
        out['kind'] = self.kind
        out['script'] = self.script
        out['entrypoint'] = self.entrypoint
        out['framework'] = self.framework
        out['config'] = self.config
        out['num_workers'] = self.num_workers
        out['cpus_per_worker'] = self.cpus_per_worker
        out['gpus_per_worker'] = self.gpus_per_worker
        out['checkpoint_every'] = self.checkpoint_every
        out['checkpoints_to_keep'] = self.checkpoints_to_keep
        out['storage_path'] = self.storage_path
        out['status'] = self.status
        out['submission_id'] = self.submission_id
        out['submitted_at'] = self.submitted_at
        out['finished_at'] = self.finished_at
        out['cancel_requested'] = self.cancel_requested
        out['logs'] = self.logs
        out['traceback'] = self.traceback
        out['checkpoints'] = self.checkpoints
        out['workspace'] = self.workspace
        out['created_by'] = self.created_by
        out['ray_cluster'] = self.ray_cluster
        out['source_experiment'] = self.source_experiment
        return out


class TrainingJobCreate(_Model):
    """POST training-jobs/."""

    __slots__ = ('workspace', 'ray_cluster', 'name', 'priority', 'queue_timeout_s', 'kind', 'script', 'entrypoint', 'framework', 'config', 'num_workers', 'cpus_per_worker', 'gpus_per_worker', 'checkpoint_every', 'checkpoints_to_keep', 'storage_path',)

    def __init__(
        self,
        *,
        workspace: str,
        ray_cluster: str,
        name: str,
        priority: int | None = None,
        queue_timeout_s: int | None = None,
        kind: str | None = None,
        script: str | None = None,
        entrypoint: str | None = None,
        framework: str | None = None,
        config: dict[str, Any] | None = None,
        num_workers: int | None = None,
        cpus_per_worker: float | None = None,
        gpus_per_worker: float | None = None,
        checkpoint_every: int | None = None,
        checkpoints_to_keep: int | None = None,
        storage_path: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.ray_cluster = ray_cluster
        self.name = name
        self.priority = priority
        self.queue_timeout_s = queue_timeout_s
        self.kind = kind
        self.script = script
        self.entrypoint = entrypoint
        self.framework = framework
        self.config = config
        self.num_workers = num_workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.checkpoint_every = checkpoint_every
        self.checkpoints_to_keep = checkpoints_to_keep
        self.storage_path = storage_path

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingJobCreate:
        return cls(
            workspace=data['workspace'],
            ray_cluster=data['ray_cluster'],
            name=data['name'],
            priority=data.get('priority'),
            queue_timeout_s=data.get('queue_timeout_s'),
            kind=data.get('kind'),
            script=data.get('script'),
            entrypoint=data.get('entrypoint'),
            framework=data.get('framework'),
            config=data.get('config'),
            num_workers=data.get('num_workers'),
            cpus_per_worker=data.get('cpus_per_worker'),
            gpus_per_worker=data.get('gpus_per_worker'),
            checkpoint_every=data.get('checkpoint_every'),
            checkpoints_to_keep=data.get('checkpoints_to_keep'),
            storage_path=data.get('storage_path'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['ray_cluster'] = self.ray_cluster
        out['name'] = self.name
        if self.priority is not None:
            out['priority'] = self.priority
        if self.queue_timeout_s is not None:
            out['queue_timeout_s'] = self.queue_timeout_s
        if self.kind is not None:
            out['kind'] = self.kind
        if self.script is not None:
            out['script'] = self.script
        if self.entrypoint is not None:
            out['entrypoint'] = self.entrypoint
        if self.framework is not None:
            out['framework'] = self.framework
        if self.config is not None:
            out['config'] = self.config
        if self.num_workers is not None:
            out['num_workers'] = self.num_workers
        if self.cpus_per_worker is not None:
            out['cpus_per_worker'] = self.cpus_per_worker
        if self.gpus_per_worker is not None:
            out['gpus_per_worker'] = self.gpus_per_worker
        if self.checkpoint_every is not None:
            out['checkpoint_every'] = self.checkpoint_every
        if self.checkpoints_to_keep is not None:
            out['checkpoints_to_keep'] = self.checkpoints_to_keep
        if self.storage_path is not None:
            out['storage_path'] = self.storage_path
        return out


class TuneExperiment(_Model):
    """A Tune experiment with its trial table."""

    __slots__ = ('id', 'queue_position', 'trials', 'hints', 'status_sentence', 'priority', 'queue_timeout_s', 'queue_reason', 'name', 'created_at', 'status_changed_at', 'failure_reason', 'last_status_at', 'search_space', 'metric', 'mode', 'num_samples', 'max_concurrent_trials', 'max_iterations', 'scheduler', 'scheduler_config', 'objective_code', 'cpus_per_trial', 'gpus_per_trial', 'training_script', 'status', 'submission_id', 'submitted_at', 'finished_at', 'cancel_requested', 'logs', 'traceback', 'best_config', 'best_result', 'workspace', 'created_by', 'ray_cluster',)

    def __init__(
        self,
        *,
        id: str,
        queue_position: int | None,
        trials: list[TuneTrial],
        hints: list[dict[str, str]],
        status_sentence: str,
        priority: int,
        queue_timeout_s: int | None,
        queue_reason: str,
        name: str,
        created_at: str,
        status_changed_at: str,
        failure_reason: str,
        last_status_at: str | None,
        search_space: Any,
        metric: str,
        mode: TuneExperimentModeEnum,
        num_samples: int,
        max_concurrent_trials: int,
        max_iterations: int,
        scheduler: SchedulerEnum,
        scheduler_config: Any,
        objective_code: str,
        cpus_per_trial: float,
        gpus_per_trial: float,
        training_script: str,
        status: JobStatusEnum,
        submission_id: str,
        submitted_at: str | None,
        finished_at: str | None,
        cancel_requested: bool,
        logs: str,
        traceback: str,
        best_config: Any,
        best_result: Any,
        workspace: str,
        created_by: int | None,
        ray_cluster: str,
    ) -> None:
        self.id = id
        self.queue_position = queue_position
        self.trials = trials
        self.hints = hints
        self.status_sentence = status_sentence
        self.priority = priority
        self.queue_timeout_s = queue_timeout_s
        self.queue_reason = queue_reason
        self.name = name
        self.created_at = created_at
        self.status_changed_at = status_changed_at
        self.failure_reason = failure_reason
        self.last_status_at = last_status_at
        self.search_space = search_space
        self.metric = metric
        self.mode = mode
        self.num_samples = num_samples
        self.max_concurrent_trials = max_concurrent_trials
        self.max_iterations = max_iterations
        self.scheduler = scheduler
        self.scheduler_config = scheduler_config
        self.objective_code = objective_code
        self.cpus_per_trial = cpus_per_trial
        self.gpus_per_trial = gpus_per_trial
        self.training_script = training_script
        self.status = status
        self.submission_id = submission_id
        self.submitted_at = submitted_at
        self.finished_at = finished_at
        self.cancel_requested = cancel_requested
        self.logs = logs
        self.traceback = traceback
        self.best_config = best_config
        self.best_result = best_result
        self.workspace = workspace
        self.created_by = created_by
        self.ray_cluster = ray_cluster

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneExperiment:
        return cls(
            id=data['id'],
            queue_position=data['queue_position'],
            trials=_list(TuneTrial.from_dict, data['trials']),
            hints=data['hints'],
            status_sentence=data['status_sentence'],
            priority=data['priority'],
            queue_timeout_s=data['queue_timeout_s'],
            queue_reason=data['queue_reason'],
            name=data['name'],
            created_at=data['created_at'],
            status_changed_at=data['status_changed_at'],
            failure_reason=data['failure_reason'],
            last_status_at=data['last_status_at'],
            search_space=data['search_space'],
            metric=data['metric'],
            mode=data['mode'],
            num_samples=data['num_samples'],
            max_concurrent_trials=data['max_concurrent_trials'],
            max_iterations=data['max_iterations'],
            scheduler=data['scheduler'],
            scheduler_config=data['scheduler_config'],
            objective_code=data['objective_code'],
            cpus_per_trial=data['cpus_per_trial'],
            gpus_per_trial=data['gpus_per_trial'],
            training_script=data['training_script'],
            status=data['status'],
            submission_id=data['submission_id'],
            submitted_at=data['submitted_at'],
            finished_at=data['finished_at'],
            cancel_requested=data['cancel_requested'],
            logs=data['logs'],
            traceback=data['traceback'],
            best_config=data['best_config'],
            best_result=data['best_result'],
            workspace=data['workspace'],
            created_by=data['created_by'],
            ray_cluster=data['ray_cluster'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['queue_position'] = self.queue_position
        out['trials'] = _list(_dump, self.trials)
        out['hints'] = self.hints
        out['status_sentence'] = self.status_sentence
        out['priority'] = self.priority
        out['queue_timeout_s'] = self.queue_timeout_s
        out['queue_reason'] = self.queue_reason
        out['name'] = self.name
        out['created_at'] = self.created_at
        out['status_changed_at'] = self.status_changed_at
        out['failure_reason'] = self.failure_reason
        out['last_status_at'] = self.last_status_at
        out['search_space'] = self.search_space
        out['metric'] = self.metric
        out['mode'] = self.mode
        out['num_samples'] = self.num_samples
        out['max_concurrent_trials'] = self.max_concurrent_trials
        out['max_iterations'] = self.max_iterations
        out['scheduler'] = self.scheduler
        out['scheduler_config'] = self.scheduler_config
        out['objective_code'] = self.objective_code
        out['cpus_per_trial'] = self.cpus_per_trial
        out['gpus_per_trial'] = self.gpus_per_trial
        out['training_script'] = self.training_script
        out['status'] = self.status
        out['submission_id'] = self.submission_id
        out['submitted_at'] = self.submitted_at
        out['finished_at'] = self.finished_at
        out['cancel_requested'] = self.cancel_requested
        out['logs'] = self.logs
        out['traceback'] = self.traceback
        out['best_config'] = self.best_config
        out['best_result'] = self.best_result
        out['workspace'] = self.workspace
        out['created_by'] = self.created_by
        out['ray_cluster'] = self.ray_cluster
        return out


class TuneExperimentCreate(_Model):
    """POST tune-experiments/."""

    __slots__ = ('workspace', 'ray_cluster', 'name', 'priority', 'queue_timeout_s', 'search_space', 'metric', 'mode', 'num_samples', 'max_concurrent_trials', 'max_iterations', 'scheduler', 'scheduler_config', 'objective_code', 'cpus_per_trial', 'gpus_per_trial', 'training_script',)

    def __init__(
        self,
        *,
        workspace: str,
        ray_cluster: str,
        name: str,
        priority: int | None = None,
        queue_timeout_s: int | None = None,
        search_space: Any,
        metric: str | None = None,
        mode: str | None = None,
        num_samples: int | None = None,
        max_concurrent_trials: int | None = None,
        max_iterations: int | None = None,
        scheduler: str | None = None,
        scheduler_config: dict[str, Any] | None = None,
        objective_code: str | None = None,
        cpus_per_trial: float | None = None,
        gpus_per_trial: float | None = None,
        training_script: str | None = None,
    ) -> None:
        self.workspace = workspace
        self.ray_cluster = ray_cluster
        self.name = name
        self.priority = priority
        self.queue_timeout_s = queue_timeout_s
        self.search_space = search_space
        self.metric = metric
        self.mode = mode
        self.num_samples = num_samples
        self.max_concurrent_trials = max_concurrent_trials
        self.max_iterations = max_iterations
        self.scheduler = scheduler
        self.scheduler_config = scheduler_config
        self.objective_code = objective_code
        self.cpus_per_trial = cpus_per_trial
        self.gpus_per_trial = gpus_per_trial
        self.training_script = training_script

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneExperimentCreate:
        return cls(
            workspace=data['workspace'],
            ray_cluster=data['ray_cluster'],
            name=data['name'],
            priority=data.get('priority'),
            queue_timeout_s=data.get('queue_timeout_s'),
            search_space=data['search_space'],
            metric=data.get('metric'),
            mode=data.get('mode'),
            num_samples=data.get('num_samples'),
            max_concurrent_trials=data.get('max_concurrent_trials'),
            max_iterations=data.get('max_iterations'),
            scheduler=data.get('scheduler'),
            scheduler_config=data.get('scheduler_config'),
            objective_code=data.get('objective_code'),
            cpus_per_trial=data.get('cpus_per_trial'),
            gpus_per_trial=data.get('gpus_per_trial'),
            training_script=data.get('training_script'),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['workspace'] = self.workspace
        out['ray_cluster'] = self.ray_cluster
        out['name'] = self.name
        if self.priority is not None:
            out['priority'] = self.priority
        if self.queue_timeout_s is not None:
            out['queue_timeout_s'] = self.queue_timeout_s
        out['search_space'] = self.search_space
        if self.metric is not None:
            out['metric'] = self.metric
        if self.mode is not None:
            out['mode'] = self.mode
        if self.num_samples is not None:
            out['num_samples'] = self.num_samples
        if self.max_concurrent_trials is not None:
            out['max_concurrent_trials'] = self.max_concurrent_trials
        if self.max_iterations is not None:
            out['max_iterations'] = self.max_iterations
        if self.scheduler is not None:
            out['scheduler'] = self.scheduler
        if self.scheduler_config is not None:
            out['scheduler_config'] = self.scheduler_config
        if self.objective_code is not None:
            out['objective_code'] = self.objective_code
        if self.cpus_per_trial is not None:
            out['cpus_per_trial'] = self.cpus_per_trial
        if self.gpus_per_trial is not None:
            out['gpus_per_trial'] = self.gpus_per_trial
        if self.training_script is not None:
            out['training_script'] = self.training_script
        return out


class TuneTrial(_Model):
    """One trial row."""

    __slots__ = ('trial_id', 'status', 'config', 'iterations', 'metric_value', 'last_result', 'updated_at',)

    def __init__(
        self,
        *,
        trial_id: str,
        status: str | None = None,
        config: Any = None,
        iterations: int | None = None,
        metric_value: float | None = None,
        last_result: Any = None,
        updated_at: str,
    ) -> None:
        self.trial_id = trial_id
        self.status = status
        self.config = config
        self.iterations = iterations
        self.metric_value = metric_value
        self.last_result = last_result
        self.updated_at = updated_at

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneTrial:
        return cls(
            trial_id=data['trial_id'],
            status=data.get('status'),
            config=data.get('config'),
            iterations=data.get('iterations'),
            metric_value=data.get('metric_value'),
            last_result=data.get('last_result'),
            updated_at=data['updated_at'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['trial_id'] = self.trial_id
        if self.status is not None:
            out['status'] = self.status
        if self.config is not None:
            out['config'] = self.config
        if self.iterations is not None:
            out['iterations'] = self.iterations
        if self.metric_value is not None:
            out['metric_value'] = self.metric_value
        if self.last_result is not None:
            out['last_result'] = self.last_result
        out['updated_at'] = self.updated_at
        return out


class Usage(_Model):
    """Usage"""

    __slots__ = ('period', 'granularity', 'start', 'end', 'currency', 'unpriced', 'totals', 'series', 'subjects',)

    def __init__(
        self,
        *,
        period: str,
        granularity: str,
        start: str,
        end: str,
        currency: str,
        unpriced: bool,
        totals: _Counters,
        series: list[UsageBucket],
        subjects: list[UsageSubject],
    ) -> None:
        self.period = period
        self.granularity = granularity
        self.start = start
        self.end = end
        self.currency = currency
        self.unpriced = unpriced
        self.totals = totals
        self.series = series
        self.subjects = subjects

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        return cls(
            period=data['period'],
            granularity=data['granularity'],
            start=data['start'],
            end=data['end'],
            currency=data['currency'],
            unpriced=data['unpriced'],
            totals=_opt(_Counters.from_dict, data['totals']),
            series=_list(UsageBucket.from_dict, data['series']),
            subjects=_list(UsageSubject.from_dict, data['subjects']),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['period'] = self.period
        out['granularity'] = self.granularity
        out['start'] = self.start
        out['end'] = self.end
        out['currency'] = self.currency
        out['unpriced'] = self.unpriced
        out['totals'] = _opt(_dump, self.totals)
        out['series'] = _list(_dump, self.series)
        out['subjects'] = _list(_dump, self.subjects)
        return out


class UsageBucket(_Model):
    """UsageBucket"""

    __slots__ = ('requests', 'errors', 'rate_limited', 'prompt_tokens', 'completion_tokens', 'latency_ms_mean', 'node_hours', 'gpu_hours', 'container_hours', 'cpu_core_hours', 'memory_gib_hours', 'cost', 'bucket_start',)

    def __init__(
        self,
        *,
        requests: int,
        errors: int,
        rate_limited: int,
        prompt_tokens: int,
        completion_tokens: int,
        latency_ms_mean: float | None,
        node_hours: float,
        gpu_hours: float,
        container_hours: float,
        cpu_core_hours: float,
        memory_gib_hours: float,
        cost: str,
        bucket_start: str,
    ) -> None:
        self.requests = requests
        self.errors = errors
        self.rate_limited = rate_limited
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.latency_ms_mean = latency_ms_mean
        self.node_hours = node_hours
        self.gpu_hours = gpu_hours
        self.container_hours = container_hours
        self.cpu_core_hours = cpu_core_hours
        self.memory_gib_hours = memory_gib_hours
        self.cost = cost
        self.bucket_start = bucket_start

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageBucket:
        return cls(
            requests=data['requests'],
            errors=data['errors'],
            rate_limited=data['rate_limited'],
            prompt_tokens=data['prompt_tokens'],
            completion_tokens=data['completion_tokens'],
            latency_ms_mean=data['latency_ms_mean'],
            node_hours=data['node_hours'],
            gpu_hours=data['gpu_hours'],
            container_hours=data['container_hours'],
            cpu_core_hours=data['cpu_core_hours'],
            memory_gib_hours=data['memory_gib_hours'],
            cost=data['cost'],
            bucket_start=data['bucket_start'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['requests'] = self.requests
        out['errors'] = self.errors
        out['rate_limited'] = self.rate_limited
        out['prompt_tokens'] = self.prompt_tokens
        out['completion_tokens'] = self.completion_tokens
        out['latency_ms_mean'] = self.latency_ms_mean
        out['node_hours'] = self.node_hours
        out['gpu_hours'] = self.gpu_hours
        out['container_hours'] = self.container_hours
        out['cpu_core_hours'] = self.cpu_core_hours
        out['memory_gib_hours'] = self.memory_gib_hours
        out['cost'] = self.cost
        out['bucket_start'] = self.bucket_start
        return out


class UsageSubject(_Model):
    """UsageSubject"""

    __slots__ = ('requests', 'errors', 'rate_limited', 'prompt_tokens', 'completion_tokens', 'latency_ms_mean', 'node_hours', 'gpu_hours', 'container_hours', 'cpu_core_hours', 'memory_gib_hours', 'cost', 'workspace_id', 'subject_kind', 'subject_id', 'name', 'api_key_id', 'api_key_name',)

    def __init__(
        self,
        *,
        requests: int,
        errors: int,
        rate_limited: int,
        prompt_tokens: int,
        completion_tokens: int,
        latency_ms_mean: float | None,
        node_hours: float,
        gpu_hours: float,
        container_hours: float,
        cpu_core_hours: float,
        memory_gib_hours: float,
        cost: str,
        workspace_id: str,
        subject_kind: SubjectKindEnum,
        subject_id: str,
        name: str,
        api_key_id: int | None,
        api_key_name: str,
    ) -> None:
        self.requests = requests
        self.errors = errors
        self.rate_limited = rate_limited
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.latency_ms_mean = latency_ms_mean
        self.node_hours = node_hours
        self.gpu_hours = gpu_hours
        self.container_hours = container_hours
        self.cpu_core_hours = cpu_core_hours
        self.memory_gib_hours = memory_gib_hours
        self.cost = cost
        self.workspace_id = workspace_id
        self.subject_kind = subject_kind
        self.subject_id = subject_id
        self.name = name
        self.api_key_id = api_key_id
        self.api_key_name = api_key_name

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageSubject:
        return cls(
            requests=data['requests'],
            errors=data['errors'],
            rate_limited=data['rate_limited'],
            prompt_tokens=data['prompt_tokens'],
            completion_tokens=data['completion_tokens'],
            latency_ms_mean=data['latency_ms_mean'],
            node_hours=data['node_hours'],
            gpu_hours=data['gpu_hours'],
            container_hours=data['container_hours'],
            cpu_core_hours=data['cpu_core_hours'],
            memory_gib_hours=data['memory_gib_hours'],
            cost=data['cost'],
            workspace_id=data['workspace_id'],
            subject_kind=data['subject_kind'],
            subject_id=data['subject_id'],
            name=data['name'],
            api_key_id=data['api_key_id'],
            api_key_name=data['api_key_name'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['requests'] = self.requests
        out['errors'] = self.errors
        out['rate_limited'] = self.rate_limited
        out['prompt_tokens'] = self.prompt_tokens
        out['completion_tokens'] = self.completion_tokens
        out['latency_ms_mean'] = self.latency_ms_mean
        out['node_hours'] = self.node_hours
        out['gpu_hours'] = self.gpu_hours
        out['container_hours'] = self.container_hours
        out['cpu_core_hours'] = self.cpu_core_hours
        out['memory_gib_hours'] = self.memory_gib_hours
        out['cost'] = self.cost
        out['workspace_id'] = self.workspace_id
        out['subject_kind'] = self.subject_kind
        out['subject_id'] = self.subject_id
        out['name'] = self.name
        out['api_key_id'] = self.api_key_id
        out['api_key_name'] = self.api_key_name
        return out


class Workspace(_Model):
    """A workspace and the caller's role in it."""

    __slots__ = ('id', 'name', 'slug', 'created_at', 'role',)

    def __init__(
        self,
        *,
        id: str,
        name: str,
        slug: str,
        created_at: str,
        role: str | None,
    ) -> None:
        self.id = id
        self.name = name
        self.slug = slug
        self.created_at = created_at
        self.role = role

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workspace:
        return cls(
            id=data['id'],
            name=data['name'],
            slug=data['slug'],
            created_at=data['created_at'],
            role=data['role'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['id'] = self.id
        out['name'] = self.name
        out['slug'] = self.slug
        out['created_at'] = self.created_at
        out['role'] = self.role
        return out


class _Counters(_Model):
    """_Counters"""

    __slots__ = ('requests', 'errors', 'rate_limited', 'prompt_tokens', 'completion_tokens', 'latency_ms_mean', 'node_hours', 'gpu_hours', 'container_hours', 'cpu_core_hours', 'memory_gib_hours', 'cost',)

    def __init__(
        self,
        *,
        requests: int,
        errors: int,
        rate_limited: int,
        prompt_tokens: int,
        completion_tokens: int,
        latency_ms_mean: float | None,
        node_hours: float,
        gpu_hours: float,
        container_hours: float,
        cpu_core_hours: float,
        memory_gib_hours: float,
        cost: str,
    ) -> None:
        self.requests = requests
        self.errors = errors
        self.rate_limited = rate_limited
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.latency_ms_mean = latency_ms_mean
        self.node_hours = node_hours
        self.gpu_hours = gpu_hours
        self.container_hours = container_hours
        self.cpu_core_hours = cpu_core_hours
        self.memory_gib_hours = memory_gib_hours
        self.cost = cost

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> _Counters:
        return cls(
            requests=data['requests'],
            errors=data['errors'],
            rate_limited=data['rate_limited'],
            prompt_tokens=data['prompt_tokens'],
            completion_tokens=data['completion_tokens'],
            latency_ms_mean=data['latency_ms_mean'],
            node_hours=data['node_hours'],
            gpu_hours=data['gpu_hours'],
            container_hours=data['container_hours'],
            cpu_core_hours=data['cpu_core_hours'],
            memory_gib_hours=data['memory_gib_hours'],
            cost=data['cost'],
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out['requests'] = self.requests
        out['errors'] = self.errors
        out['rate_limited'] = self.rate_limited
        out['prompt_tokens'] = self.prompt_tokens
        out['completion_tokens'] = self.completion_tokens
        out['latency_ms_mean'] = self.latency_ms_mean
        out['node_hours'] = self.node_hours
        out['gpu_hours'] = self.gpu_hours
        out['container_hours'] = self.container_hours
        out['cpu_core_hours'] = self.cpu_core_hours
        out['memory_gib_hours'] = self.memory_gib_hours
        out['cost'] = self.cost
        return out


# Component name -> model class.
MODELS: dict[str, type] = {
    'AdapterAttach': AdapterAttach,
    'AgentRegister': AgentRegister,
    'AgentRegistered': AgentRegistered,
    'AgentUpdates': AgentUpdates,
    'ApiKey': ApiKey,
    'ApiKeyCreate': ApiKeyCreate,
    'ApiKeyCreated': ApiKeyCreated,
    'AuditEntry': AuditEntry,
    'Budget': Budget,
    'BudgetSet': BudgetSet,
    'CachedModel': CachedModel,
    'CatalogCreate': CatalogCreate,
    'CatalogFit': CatalogFit,
    'CatalogModel': CatalogModel,
    'Cluster': Cluster,
    'ClusterCreate': ClusterCreate,
    'ClusterUpdate': ClusterUpdate,
    'Command': Command,
    'CommandBatch': CommandBatch,
    'CommandPage': CommandPage,
    'CommandRef': CommandRef,
    'Container': Container,
    'ContainerCreateCommand': ContainerCreateCommand,
    'ContainerCreatePayload': ContainerCreatePayload,
    'ContainerDestroyCommand': ContainerDestroyCommand,
    'ContainerRefPayload': ContainerRefPayload,
    'ContainerStartCommand': ContainerStartCommand,
    'ContainerStopCommand': ContainerStopCommand,
    'Download': Download,
    'Endpoint': Endpoint,
    'EndpointAdapterLoadCommand': EndpointAdapterLoadCommand,
    'EndpointAdapterLoadPayload': EndpointAdapterLoadPayload,
    'EndpointAdapterUnloadCommand': EndpointAdapterUnloadCommand,
    'EndpointAdapterUnloadPayload': EndpointAdapterUnloadPayload,
    'EndpointAdmission': EndpointAdmission,
    'EndpointBenchmark': EndpointBenchmark,
    'EndpointBenchmarkCreate': EndpointBenchmarkCreate,
    'EndpointCreate': EndpointCreate,
    'EndpointEvent': EndpointEvent,
    'EndpointEventPage': EndpointEventPage,
    'EndpointGroup': EndpointGroup,
    'EndpointLimits': EndpointLimits,
    'EndpointReplica': EndpointReplica,
    'EndpointRevision': EndpointRevision,
    'EndpointStartCommand': EndpointStartCommand,
    'EndpointStartPayload': EndpointStartPayload,
    'EndpointStopCommand': EndpointStopCommand,
    'EndpointStopPayload': EndpointStopPayload,
    'EndpointUpdate': EndpointUpdate,
    'Error': Error,
    'FieldErrors': FieldErrors,
    'JoinToken': JoinToken,
    'LoraAdapter': LoraAdapter,
    'LoraAdapterCreate': LoraAdapterCreate,
    'LoraAdapterRef': LoraAdapterRef,
    'Membership': Membership,
    'ModelDownloadCommand': ModelDownloadCommand,
    'ModelDownloadPayload': ModelDownloadPayload,
    'ModelEvictCommand': ModelEvictCommand,
    'ModelEvictPayload': ModelEvictPayload,
    'ModelLocation': ModelLocation,
    'Namespace': Namespace,
    'NamespaceCreate': NamespaceCreate,
    'Node': Node,
    'NodeCache': NodeCache,
    'NodeEvent': NodeEvent,
    'NodeEventPage': NodeEventPage,
    'NodeFit': NodeFit,
    'PaginatedApiKeyList': PaginatedApiKeyList,
    'PaginatedAuditEntryList': PaginatedAuditEntryList,
    'PaginatedCatalogFitList': PaginatedCatalogFitList,
    'PaginatedClusterList': PaginatedClusterList,
    'PaginatedCommandList': PaginatedCommandList,
    'PaginatedContainerList': PaginatedContainerList,
    'PaginatedEndpointBenchmarkList': PaginatedEndpointBenchmarkList,
    'PaginatedEndpointList': PaginatedEndpointList,
    'PaginatedLoraAdapterList': PaginatedLoraAdapterList,
    'PaginatedModelLocationList': PaginatedModelLocationList,
    'PaginatedNamespaceList': PaginatedNamespaceList,
    'PaginatedNodeCacheList': PaginatedNodeCacheList,
    'PaginatedNodeList': PaginatedNodeList,
    'PaginatedRayClusterList': PaginatedRayClusterList,
    'PaginatedServeDeploymentList': PaginatedServeDeploymentList,
    'PaginatedTrainingJobList': PaginatedTrainingJobList,
    'PaginatedTuneExperimentList': PaginatedTuneExperimentList,
    'PaginatedWorkspaceList': PaginatedWorkspaceList,
    'PatchedClusterUpdate': PatchedClusterUpdate,
    'PatchedNamespaceBind': PatchedNamespaceBind,
    'PatchedNodeRename': PatchedNodeRename,
    'PatchedQuotaLimits': PatchedQuotaLimits,
    'PatchedRayClusterUpdate': PatchedRayClusterUpdate,
    'PortMapping': PortMapping,
    'PriceVersion': PriceVersion,
    'QueueFigures': QueueFigures,
    'QuotaLine': QuotaLine,
    'Quotas': Quotas,
    'RayCluster': RayCluster,
    'RayClusterCreate': RayClusterCreate,
    'RayClusterEvent': RayClusterEvent,
    'RayClusterEventPage': RayClusterEventPage,
    'RayNode': RayNode,
    'ServeDeployment': ServeDeployment,
    'ServeDeploymentCreate': ServeDeploymentCreate,
    'TrainWithBest': TrainWithBest,
    'TrainingJob': TrainingJob,
    'TrainingJobCreate': TrainingJobCreate,
    'TuneExperiment': TuneExperiment,
    'TuneExperimentCreate': TuneExperimentCreate,
    'TuneTrial': TuneTrial,
    'Usage': Usage,
    'UsageBucket': UsageBucket,
    'UsageSubject': UsageSubject,
    'Workspace': Workspace,
    '_Counters': _Counters,
}

# Every operation of the API: operationId -> (HTTP method, path template).
OPERATIONS: dict[str, tuple[str, str]] = {
    'v1_adapters_list': ('GET', '/api/v1/adapters/'),
    'v1_adapters_create': ('POST', '/api/v1/adapters/'),
    'v1_adapters_destroy': ('DELETE', '/api/v1/adapters/{id}/'),
    'v1_adapters_retrieve': ('GET', '/api/v1/adapters/{id}/'),
    'v1_adapters_attach_create': ('POST', '/api/v1/adapters/{id}/attach/'),
    'v1_adapters_detach_create': ('POST', '/api/v1/adapters/{id}/detach/'),
    'v1_agent_register_create': ('POST', '/api/v1/agent/register'),
    'v1_api_keys_list': ('GET', '/api/v1/api-keys/'),
    'v1_api_keys_create': ('POST', '/api/v1/api-keys/'),
    'v1_api_keys_destroy': ('DELETE', '/api/v1/api-keys/{id}/'),
    'v1_api_keys_retrieve': ('GET', '/api/v1/api-keys/{id}/'),
    'v1_audit_list': ('GET', '/api/v1/audit/'),
    'v1_audit_retrieve': ('GET', '/api/v1/audit/{id}/'),
    'v1_budgets_list': ('GET', '/api/v1/budgets/'),
    'v1_budgets_update': ('PUT', '/api/v1/budgets/'),
    'v1_catalog_list': ('GET', '/api/v1/catalog/'),
    'v1_catalog_create': ('POST', '/api/v1/catalog/'),
    'v1_catalog_destroy': ('DELETE', '/api/v1/catalog/{id}/'),
    'v1_catalog_retrieve': ('GET', '/api/v1/catalog/{id}/'),
    'v1_clusters_list': ('GET', '/api/v1/clusters/'),
    'v1_clusters_create': ('POST', '/api/v1/clusters/'),
    'v1_clusters_destroy': ('DELETE', '/api/v1/clusters/{id}/'),
    'v1_clusters_retrieve': ('GET', '/api/v1/clusters/{id}/'),
    'v1_clusters_partial_update': ('PATCH', '/api/v1/clusters/{id}/'),
    'v1_clusters_update': ('PUT', '/api/v1/clusters/{id}/'),
    'v1_clusters_commands_retrieve': ('GET', '/api/v1/clusters/{id}/commands/'),
    'v1_clusters_commands_create': ('POST', '/api/v1/clusters/{id}/commands/'),
    'v1_clusters_join_tokens_create': ('POST', '/api/v1/clusters/{id}/join-tokens/'),
    'v1_clusters_resume_automation_create': ('POST', '/api/v1/clusters/{id}/resume-automation/'),
    'v1_clusters_update_agents_create': ('POST', '/api/v1/clusters/{id}/update-agents/'),
    'v1_commands_list': ('GET', '/api/v1/commands/'),
    'v1_commands_retrieve': ('GET', '/api/v1/commands/{id}/'),
    'v1_containers_list': ('GET', '/api/v1/containers/'),
    'v1_containers_retrieve': ('GET', '/api/v1/containers/{id}/'),
    'v1_endpoint_benchmarks_list': ('GET', '/api/v1/endpoint-benchmarks/'),
    'v1_endpoint_benchmarks_create': ('POST', '/api/v1/endpoint-benchmarks/'),
    'v1_endpoint_benchmarks_retrieve': ('GET', '/api/v1/endpoint-benchmarks/{id}/'),
    'v1_endpoint_benchmarks_export_retrieve': ('GET', '/api/v1/endpoint-benchmarks/{id}/export/'),
    'v1_endpoints_list': ('GET', '/api/v1/endpoints/'),
    'v1_endpoints_create': ('POST', '/api/v1/endpoints/'),
    'v1_endpoints_retrieve': ('GET', '/api/v1/endpoints/{id}/'),
    'v1_endpoints_admission_create': ('POST', '/api/v1/endpoints/{id}/admission/'),
    'v1_endpoints_events_retrieve': ('GET', '/api/v1/endpoints/{id}/events/'),
    'v1_endpoints_limits_create': ('POST', '/api/v1/endpoints/{id}/limits/'),
    'v1_endpoints_stop_create': ('POST', '/api/v1/endpoints/{id}/stop/'),
    'v1_endpoints_update_create': ('POST', '/api/v1/endpoints/{id}/update/'),
    'v1_endpoints_update_revision_create': ('POST', '/api/v1/endpoints/{id}/update_revision/'),
    'v1_model_caches_list': ('GET', '/api/v1/model-caches/'),
    'v1_model_caches_retrieve': ('GET', '/api/v1/model-caches/{id}/'),
    'v1_model_caches_budget_create': ('POST', '/api/v1/model-caches/{id}/budget/'),
    'v1_models_list': ('GET', '/api/v1/models/'),
    'v1_models_retrieve': ('GET', '/api/v1/models/{id}/'),
    'v1_models_evict_create': ('POST', '/api/v1/models/{id}/evict/'),
    'v1_namespaces_list': ('GET', '/api/v1/namespaces/'),
    'v1_namespaces_create': ('POST', '/api/v1/namespaces/'),
    'v1_namespaces_destroy': ('DELETE', '/api/v1/namespaces/{id}/'),
    'v1_namespaces_retrieve': ('GET', '/api/v1/namespaces/{id}/'),
    'v1_namespaces_partial_update': ('PATCH', '/api/v1/namespaces/{id}/'),
    'v1_nodes_list': ('GET', '/api/v1/nodes/'),
    'v1_nodes_destroy': ('DELETE', '/api/v1/nodes/{id}/'),
    'v1_nodes_retrieve': ('GET', '/api/v1/nodes/{id}/'),
    'v1_nodes_partial_update': ('PATCH', '/api/v1/nodes/{id}/'),
    'v1_nodes_cordon_create': ('POST', '/api/v1/nodes/{id}/cordon/'),
    'v1_nodes_drain_create': ('POST', '/api/v1/nodes/{id}/drain/'),
    'v1_nodes_events_retrieve': ('GET', '/api/v1/nodes/{id}/events/'),
    'v1_nodes_uncordon_create': ('POST', '/api/v1/nodes/{id}/uncordon/'),
    'v1_nodes_update_agent_create': ('POST', '/api/v1/nodes/{id}/update-agent/'),
    'v1_prices_list': ('GET', '/api/v1/prices/'),
    'v1_prices_create': ('POST', '/api/v1/prices/'),
    'v1_ray_clusters_list': ('GET', '/api/v1/ray/clusters/'),
    'v1_ray_clusters_create': ('POST', '/api/v1/ray/clusters/'),
    'v1_ray_clusters_destroy': ('DELETE', '/api/v1/ray/clusters/{id}/'),
    'v1_ray_clusters_retrieve': ('GET', '/api/v1/ray/clusters/{id}/'),
    'v1_ray_clusters_partial_update': ('PATCH', '/api/v1/ray/clusters/{id}/'),
    'v1_ray_clusters_events_retrieve': ('GET', '/api/v1/ray/clusters/{id}/events/'),
    'v1_ray_clusters_nodes_list': ('GET', '/api/v1/ray/clusters/{id}/nodes/'),
    'v1_ray_clusters_start_create': ('POST', '/api/v1/ray/clusters/{id}/start/'),
    'v1_ray_clusters_stop_create': ('POST', '/api/v1/ray/clusters/{id}/stop/'),
    'v1_ray_deployments_list': ('GET', '/api/v1/ray/deployments/'),
    'v1_ray_deployments_create': ('POST', '/api/v1/ray/deployments/'),
    'v1_ray_deployments_retrieve': ('GET', '/api/v1/ray/deployments/{id}/'),
    'v1_ray_deployments_stop_create': ('POST', '/api/v1/ray/deployments/{id}/stop/'),
    'v1_ray_training_jobs_list': ('GET', '/api/v1/ray/training-jobs/'),
    'v1_ray_training_jobs_create': ('POST', '/api/v1/ray/training-jobs/'),
    'v1_ray_training_jobs_retrieve': ('GET', '/api/v1/ray/training-jobs/{id}/'),
    'v1_ray_training_jobs_cancel_create': ('POST', '/api/v1/ray/training-jobs/{id}/cancel/'),
    'v1_ray_tune_experiments_list': ('GET', '/api/v1/ray/tune-experiments/'),
    'v1_ray_tune_experiments_create': ('POST', '/api/v1/ray/tune-experiments/'),
    'v1_ray_tune_experiments_retrieve': ('GET', '/api/v1/ray/tune-experiments/{id}/'),
    'v1_ray_tune_experiments_cancel_create': ('POST', '/api/v1/ray/tune-experiments/{id}/cancel/'),
    'v1_ray_tune_experiments_train_create': ('POST', '/api/v1/ray/tune-experiments/{id}/train/'),
    'v1_usage_retrieve': ('GET', '/api/v1/usage/'),
    'v1_workspaces_list': ('GET', '/api/v1/workspaces/'),
    'v1_workspaces_retrieve': ('GET', '/api/v1/workspaces/{id}/'),
    'v1_workspaces_members_list': ('GET', '/api/v1/workspaces/{id}/members/'),
    'v1_workspaces_quotas_retrieve': ('GET', '/api/v1/workspaces/{id}/quotas/'),
    'v1_workspaces_quotas_partial_update': ('PATCH', '/api/v1/workspaces/{id}/quotas/'),
}
