"""Where the command line keeps its sign-ins: `~/.config/ctfleet/config.yaml` (mode 0600), by profile.

    current: default
    profiles:
      default: {url: https://fleet.example.com, api_key: ctk_…}

`CTFLEET_CONFIG` names another file; `CTFLEET_PROFILE` picks a profile; `CTFLEET_URL` and `CTFLEET_API_KEY`
override the profile's URL and key (a CI job needs no file at all).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctfleet.errors import ConfigError


def config_path() -> Path:
    """The config file: $CTFLEET_CONFIG, else $XDG_CONFIG_HOME/ctfleet/config.yaml, else ~/.config/…."""
    if os.environ.get("CTFLEET_CONFIG"):
        return Path(os.environ["CTFLEET_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ctfleet" / "config.yaml"


def load() -> dict[str, Any]:
    """The whole config file ({} when there is none)."""
    path = config_path()
    if not path.exists():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"Cannot read {path}: {exc}", hint=f"Fix or remove {path}, then `ctfleet login`.") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a mapping.", hint=f"Remove {path}, then `ctfleet login`.")
    return data


def save(data: dict[str, Any]) -> Path:
    """Write the config file with mode 0600 (its folder 0700): it holds API keys."""
    import yaml

    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


@dataclass
class Profile:
    """The sign-in a command uses: its profile name, the control plane URL and the API key."""

    name: str
    url: str | None
    api_key: str | None
    workspace: str | None = None


def active_profile(name: str | None = None) -> Profile:
    """The profile named (or $CTFLEET_PROFILE, or the file's `current`, or `default`), with the
    environment's URL and key taking precedence."""
    data = load()
    chosen = name or os.environ.get("CTFLEET_PROFILE") or data.get("current") or "default"
    stored = (data.get("profiles") or {}).get(chosen) or {}
    return Profile(
        name=chosen,
        url=os.environ.get("CTFLEET_URL") or stored.get("url"),
        api_key=os.environ.get("CTFLEET_API_KEY") or stored.get("api_key"),
        workspace=os.environ.get("CTFLEET_WORKSPACE") or stored.get("workspace"),
    )


def store_profile(profile: Profile, *, make_current: bool = True) -> Path:
    """Save `profile` (URL, key, default workspace) and make it the current one."""
    data = load()
    profiles = data.setdefault("profiles", {})
    entry = {"url": profile.url, "api_key": profile.api_key}
    if profile.workspace:
        entry["workspace"] = profile.workspace
    profiles[profile.name] = entry
    if make_current or "current" not in data:
        data["current"] = profile.name
    return save(data)
