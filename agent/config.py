"""Agent configuration: what `join` writes under the state dir and `run` reads back."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path("/etc/cleverthis-agent")
DEFAULT_MODEL_CACHE = Path("/var/cache/cleverthis/models")
NODE_FILE = "node.json"
KEY_FILE = "node.key"
CERT_FILE = "node.crt"
CA_FILE = "ca.crt"


def state_dir_from_env(explicit: str | None = None) -> Path:
    """The state dir: `--state-dir`, else CLEVERTHIS_STATE_DIR, else /etc/cleverthis-agent."""
    return Path(explicit or os.environ.get("CLEVERTHIS_STATE_DIR") or DEFAULT_STATE_DIR)


@dataclass(frozen=True)
class AgentConfig:
    """A registered node's identity and where its files live."""

    control_plane_url: str
    node_id: str
    tunnel_path: str
    heartbeat_interval_s: float
    state_dir: str

    @property
    def key_path(self) -> Path:
        return Path(self.state_dir) / KEY_FILE

    @property
    def cert_path(self) -> Path:
        return Path(self.state_dir) / CERT_FILE

    @property
    def ca_path(self) -> Path:
        return Path(self.state_dir) / CA_FILE

    @property
    def tunnel_url(self) -> str:
        """ws(s)://host/agent/tunnel derived from the control plane's http(s) URL."""
        base = self.control_plane_url.rstrip("/")
        if base.startswith("https://"):
            base = "wss://" + base[len("https://") :]
        elif base.startswith("http://"):
            base = "ws://" + base[len("http://") :]
        return base + self.tunnel_path

    @property
    def model_cache(self) -> Path:
        return Path(os.environ.get("CLEVERTHIS_MODEL_CACHE") or DEFAULT_MODEL_CACHE)

    @property
    def work_dir(self) -> Path:
        """Scratch space for GitOps clones and endpoint state."""
        return Path(self.state_dir) / "work"

    def save(self) -> None:
        """Write node.json atomically."""
        path = Path(self.state_dir) / NODE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, state_dir: Path) -> AgentConfig:
        """Read node.json; a clear error when the node was never joined."""
        path = state_dir / NODE_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run `python -m agent join --url ... --token ...` first")
        return cls(**json.loads(path.read_text()))
