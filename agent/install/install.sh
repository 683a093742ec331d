#!/bin/sh
# CleverThis compute agent installer, served by the control plane at /agent/install.sh:
#
#   curl -fsSL <control-plane>/agent/install.sh | CLUSTER_TOKEN=ct_node_... sh
#
# It checks for Linux and Docker (installing Docker with the distro's package manager when missing),
# installs the agent into its own venv, registers the node with CLUSTER_TOKEN, then installs and starts
# the systemd unit cleverthis-agent. Running it again updates the agent in place and restarts it
# without registering again.
#
# Settings (environment variables):
#   CONTROL_PLANE_URL  control plane to join (default: the one that served this script)
#   CLUSTER_TOKEN      join token; required on the first install, ignored once the node is registered
#   AGENT_PACKAGE      pip requirement for the agent (default: $CONTROL_PLANE_URL/agent/package.tar.gz)
#   PIP_ARGS           extra pip arguments, e.g. "--no-index --find-links /srv/wheels"
#   PYTHON             Python 3.11+ that creates the venv (default: python3)
#   SKIP_DOCKER=1      neither check nor install Docker (Kubernetes and ArgoCD nodes)
#   DRY_RUN=1          print package-manager and systemctl commands instead of running them (the venv,
#                      the registration and the unit below PREFIX are still written)
#   PREFIX             install below this directory instead of / (tests, staging)
#   OS_RELEASE_FILE    distro description used to pick the package manager (default: /etc/os-release)
#   CLEVERTHIS_MODEL_CACHE  model cache (default: /var/cache/cleverthis/models, below PREFIX)
#   CLEVERTHIS_KUBECONFIG, DOCKER_HOST  written to the agent's environment file when set
#
# Every failure ends with one line "error: <what went wrong and what to do>" on stderr and a non-zero exit.
# Everything happens inside main, called on the last line, so a truncated download runs nothing.
set -eu

CONTROL_PLANE_URL="${CONTROL_PLANE_URL:-__CONTROL_PLANE_URL__}"
PREFIX="${PREFIX:-}"
PREFIX="${PREFIX%/}"
case "$PREFIX" in
"" | /*) ;;
*) PREFIX="$PWD/$PREFIX" ;;
esac
DRY_RUN="${DRY_RUN:-0}"
SKIP_DOCKER="${SKIP_DOCKER:-0}"
PYTHON="${PYTHON:-python3}"
PIP_ARGS="${PIP_ARGS:-}"
OS_RELEASE_FILE="${OS_RELEASE_FILE:-/etc/os-release}"
AGENT_PACKAGE="${AGENT_PACKAGE:-}"

SERVICE=cleverthis-agent
INSTALL_DIR="$PREFIX/opt/cleverthis-agent"
VENV="$INSTALL_DIR/venv"
STATE_DIR="$PREFIX/etc/cleverthis-agent"
UNIT_DIR="$PREFIX/etc/systemd/system"
UNIT_PATH="$UNIT_DIR/$SERVICE.service"
MODEL_CACHE="$PREFIX${CLEVERTHIS_MODEL_CACHE:-/var/cache/cleverthis/models}"

# The join token lives in a shell variable that child processes do not inherit.
token="${CLUSTER_TOKEN:-}"
unset CLUSTER_TOKEN
SUDO=""
UPDATE=0
PACKAGE_MANAGER=""
DISTRO_ID=""
tmpfile=""
errlog=""
failure=""
DOCKER_HINT="or set SKIP_DOCKER=1 on Kubernetes and ArgoCD nodes"

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}
is_true() {
	case "$1" in
	1 | true | yes | on | TRUE | YES | ON) return 0 ;;
	*) return 1 ;;
	esac
}
cleanup() {
	[ -z "$tmpfile" ] || rm -f "$tmpfile"
	[ -z "$errlog" ] || rm -f "$errlog"
}

# The last non-empty line of a file, on one line, without an "error:" prefix.
last_line() {
	sed -e '/^[[:space:]]*$/d' "$1" |
		sed -n -e '$!d' -e 's/^error: //' -e 's/^ERROR: //' -e 's/^E: //' -e 's/[[:space:]][[:space:]]*/ /g' -e p
}

# Run a command with its stderr kept aside: replayed when it succeeds; when it fails, its last line is
# left in $failure (for a one-line error message) and its exit status is returned.
capture() {
	[ -n "$errlog" ] || errlog=$(mktemp)
	if "$@" 2>"$errlog"; then
		cat "$errlog" >&2
		return 0
	else
		status=$?
		failure=$(last_line "$errlog")
		[ -n "$failure" ] || failure="exit status $status"
		return "$status"
	fi
}

# Run a command as root (through sudo when the installer is not root).
as_root() {
	if [ -n "$SUDO" ]; then
		"$SUDO" "$@"
	else
		"$@"
	fi
}

# Run a command that changes the system outside the agent's own directories (printed under DRY_RUN).
# If it fails, stop with one line: $1 (what went wrong), the command's last error line, $2 (what to do).
system() {
	what=$1
	remedy=$2
	shift 2
	if is_true "$DRY_RUN"; then
		printf '[dry-run] %s\n' "$*"
		return 0
	fi
	note "running: $*"
	capture as_root "$@" || die "$what ('$*' failed: $failure): $remedy"
}

# systemctl, printed under DRY_RUN or where systemd is not available.
service_ctl() {
	if is_true "$DRY_RUN"; then
		printf '[dry-run] systemctl %s\n' "$*"
	elif ! command -v systemctl >/dev/null 2>&1; then
		printf '[no systemctl] would run: systemctl %s\n' "$*"
	else
		note "running: systemctl $*"
		capture as_root systemctl "$@" || die "'systemctl $*' failed ($failure): see systemctl status $SERVICE and journalctl -u $SERVICE"
	fi
}

# Escape a value for the replacement side of a sed s|||g expression.
sed_escape() { printf '%s' "$1" | sed -e 's/[\\&|]/\\&/g'; }

# The systemd unit, embedded by the control plane when it serves this script.
unit_template() {
	cat <<'CLEVERTHIS_UNIT'
__CLEVERTHIS_AGENT_UNIT__
CLEVERTHIS_UNIT
}

os_release_value() {
	[ -r "$OS_RELEASE_FILE" ] || return 0
	sed -n "s/^$1=//p" "$OS_RELEASE_FILE" | head -n 1 | tr -d "\"'"
}

preflight() {
	say "Checking the system"
	os=$(uname -s 2>/dev/null || echo unknown)
	[ "$os" = Linux ] || die "the CleverThis agent runs on Linux only; this system reports '$os'"
	case "$CONTROL_PLANE_URL" in
	http://?* | https://?*) ;;
	*) die "CONTROL_PLANE_URL is not set to an http(s) URL; download this script from the control plane's /agent/install.sh" ;;
	esac
	CONTROL_PLANE_URL="${CONTROL_PLANE_URL%/}"
	case "$PREFIX$MODEL_CACHE" in
	*[[:space:]]*) die "install paths must not contain whitespace: '$PREFIX', '$MODEL_CACHE'" ;;
	esac
	unit_template | grep -q '^\[Service\]' ||
		die "this script carries no systemd unit; download it from the control plane's /agent/install.sh"
	[ -n "$AGENT_PACKAGE" ] || AGENT_PACKAGE="$CONTROL_PLANE_URL/agent/package.tar.gz"

	if [ -f "$STATE_DIR/node.json" ]; then
		UPDATE=1
		note "this node is registered already ($STATE_DIR/node.json): updating in place"
		[ -z "$token" ] || note "CLUSTER_TOKEN is ignored: remove $STATE_DIR to register this machine again"
	elif [ -z "$token" ]; then
		die "CLUSTER_TOKEN is required for the first install: generate a join token on the cluster's Commands tab and run the command it shows: curl -fsSL $CONTROL_PLANE_URL/agent/install.sh | CLUSTER_TOKEN=<token> sh"
	fi

	if [ -z "$PREFIX" ] && [ "$(id -u)" != 0 ]; then
		if command -v sudo >/dev/null 2>&1; then
			SUDO=sudo
			note "not running as root: using sudo"
		else
			die "run the installer as root: curl -fsSL $CONTROL_PLANE_URL/agent/install.sh | sudo CLUSTER_TOKEN=<token> sh"
		fi
	fi
	DISTRO_ID=$(os_release_value ID)
	note "Linux, distribution '${DISTRO_ID:-unknown}'"
	check_control_plane
}

# Fail early, in one line, when the control plane cannot be reached (with curl or wget; without either,
# pip and the join below find out).
check_control_plane() {
	probe="$CONTROL_PLANE_URL/agent/install.sh"
	failure=""
	if command -v curl >/dev/null 2>&1; then
		capture curl -fsS -o /dev/null --connect-timeout 10 --max-time 30 "$probe" || true
	elif command -v wget >/dev/null 2>&1; then
		capture wget -q -O /dev/null -T 30 "$probe" || true
	else
		return 0
	fi
	[ -n "$failure" ] || {
		note "the control plane answers at $CONTROL_PLANE_URL"
		return 0
	}
	die "cannot reach the control plane at $CONTROL_PLANE_URL ($failure): check that this machine can connect to it (firewall, proxy, DNS) and that the URL is right"
}

detect_package_manager() {
	[ -z "$PACKAGE_MANAGER" ] || return 0
	for name in $DISTRO_ID $(os_release_value ID_LIKE); do
		case "$name" in
		debian | ubuntu | raspbian | linuxmint | pop) PACKAGE_MANAGER=apt-get ;;
		fedora | rhel | centos | rocky | almalinux | amzn | ol)
			if command -v dnf >/dev/null 2>&1 || ! command -v yum >/dev/null 2>&1; then
				PACKAGE_MANAGER=dnf
			else
				PACKAGE_MANAGER=yum
			fi
			;;
		suse | opensuse | opensuse-leap | opensuse-tumbleweed | sles) PACKAGE_MANAGER=zypper ;;
		alpine) PACKAGE_MANAGER=apk ;;
		arch | manjaro) PACKAGE_MANAGER=pacman ;;
		esac
		[ -z "$PACKAGE_MANAGER" ] || return 0
	done
	for name in apt-get dnf yum zypper apk pacman; do
		if command -v "$name" >/dev/null 2>&1; then
			PACKAGE_MANAGER=$name
			return 0
		fi
	done
	return 1
}

install_docker() {
	what="Docker is not installed and could not be installed"
	hint="install Docker (https://docs.docker.com/engine/install/) and run this again, $DOCKER_HINT"
	detect_package_manager ||
		die "Docker is not installed and no supported package manager (apt-get, dnf, yum, zypper, apk, pacman) was found: install Docker (https://docs.docker.com/engine/install/) and run this again, $DOCKER_HINT"
	say "Installing Docker with $PACKAGE_MANAGER"
	case "$PACKAGE_MANAGER" in
	apt-get)
		system "$what" "$hint" apt-get update
		system "$what" "$hint" env DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io
		;;
	dnf)
		case "$DISTRO_ID" in
		fedora) system "$what" "$hint" dnf install -y moby-engine ;;
		amzn) system "$what" "$hint" dnf install -y docker ;;
		*)
			system "$what" "$hint" dnf install -y dnf-plugins-core
			system "$what" "$hint" dnf config-manager --add-repo https://download.docker.com/linux/centos/docker-ce.repo
			system "$what" "$hint" dnf install -y docker-ce docker-ce-cli containerd.io
			;;
		esac
		;;
	yum) system "$what" "$hint" yum install -y docker ;;
	zypper) system "$what" "$hint" zypper --non-interactive install docker ;;
	apk) system "$what" "$hint" apk add --no-cache docker ;;
	pacman) system "$what" "$hint" pacman -Sy --noconfirm docker ;;
	esac
}

start_docker() {
	what="Docker does not answer 'docker info' and could not be started"
	hint="start the Docker daemon, $DOCKER_HINT"
	if command -v systemctl >/dev/null 2>&1; then
		system "$what" "$hint" systemctl enable --now docker
	elif command -v rc-update >/dev/null 2>&1 || [ "$PACKAGE_MANAGER" = apk ]; then
		system "$what" "$hint" rc-update add docker default
		system "$what" "$hint" service docker start
	elif is_true "$DRY_RUN"; then
		system "$what" "$hint" systemctl enable --now docker
	else
		warn "cannot start Docker here (neither systemctl nor rc-update found): start the Docker daemon yourself"
	fi
}

docker_running() { command -v docker >/dev/null 2>&1 && as_root docker info >/dev/null 2>&1; }

ensure_docker() {
	if is_true "$SKIP_DOCKER"; then
		say "Skipping Docker (SKIP_DOCKER=$SKIP_DOCKER)"
		return 0
	fi
	say "Checking Docker"
	if docker_running; then
		note "Docker is installed and running"
		return 0
	fi
	if command -v docker >/dev/null 2>&1; then
		note "Docker is installed but its daemon does not answer: starting it"
	else
		note "Docker is not installed"
		install_docker
	fi
	start_docker
	is_true "$DRY_RUN" && return 0
	docker_running || die "Docker still does not answer 'docker info': check 'systemctl status docker', $DOCKER_HINT"
	note "Docker is running"
}

ensure_python() {
	say "Checking Python"
	command -v "$PYTHON" >/dev/null 2>&1 ||
		die "$PYTHON not found: install Python 3.11 or newer, or set PYTHON=/path/to/python3"
	"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
		die "the agent needs Python 3.11 or newer; $PYTHON is $("$PYTHON" -V 2>&1)"
	if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
		if detect_package_manager && [ "$PACKAGE_MANAGER" = apt-get ]; then
			note "$PYTHON cannot create virtual environments: installing python3-venv"
			system "$PYTHON cannot create virtual environments and python3-venv could not be installed" \
				"install python3-venv, or set PYTHON to a Python 3.11+ that has the venv and ensurepip modules" \
				env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
		else
			die "$PYTHON cannot create virtual environments (the venv or ensurepip module is missing)"
		fi
	fi
	note "$("$PYTHON" -V 2>&1)"
}

install_agent() {
	say "Installing the agent into $VENV"
	if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c '' >/dev/null 2>&1; then
		note "reusing the existing venv"
	else
		note "creating the venv"
		as_root mkdir -p "$INSTALL_DIR"
		capture as_root "$PYTHON" -m venv --clear "$VENV" || die "could not create the venv $VENV ($failure)"
	fi
	note "pip install --upgrade $AGENT_PACKAGE"
	# shellcheck disable=SC2086 # PIP_ARGS is a list of words.
	capture as_root "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade $PIP_ARGS "$AGENT_PACKAGE" ||
		die "pip could not install the agent from $AGENT_PACKAGE ($failure)"
	if [ "$UPDATE" = 1 ]; then
		# An unchanged version number must still pick up the control plane's current agent.
		# shellcheck disable=SC2086 # PIP_ARGS is a list of words.
		capture as_root "$VENV/bin/python" -m pip install --disable-pip-version-check --force-reinstall --no-deps $PIP_ARGS "$AGENT_PACKAGE" ||
			die "pip could not reinstall the agent from $AGENT_PACKAGE ($failure)"
	fi
	capture "$VENV/bin/python" -c 'import agent' || die "the agent package is not importable in $VENV ($failure)"
	if [ "$UPDATE" = 1 ] && { [ -e "$STATE_DIR/versions/current" ] || [ -L "$STATE_DIR/versions/current" ]; }; then
		# Versions the agent installed by updating itself stay in $STATE_DIR/versions, but the one just
		# installed is what runs from now on (and no update in flight rolls it back).
		note "the agent runs the version just installed (earlier self-updates stay in $STATE_DIR/versions)"
		as_root rm -f "$STATE_DIR/versions/current" "$STATE_DIR/versions/update.json"
	fi
	as_root mkdir -p "$MODEL_CACHE"
}

join_cluster() {
	if [ "$UPDATE" = 1 ]; then
		say "Registration: already registered, not joining again"
		return 0
	fi
	say "Registering this node with $CONTROL_PLANE_URL"
	as_root mkdir -p "$STATE_DIR"
	as_root chmod 700 "$STATE_DIR"
	note "running: $VENV/bin/python -m agent join --url $CONTROL_PLANE_URL --token **** --state-dir $STATE_DIR"
	capture as_root env CLEVERTHIS_STATE_DIR="$STATE_DIR" CLEVERTHIS_MODEL_CACHE="$MODEL_CACHE" \
		"$VENV/bin/python" -m agent join --url "$CONTROL_PLANE_URL" --token "$token" --state-dir "$STATE_DIR" ||
		die "joining the cluster failed: $failure"
	[ -f "$STATE_DIR/node.json" ] || die "join reported success but wrote no $STATE_DIR/node.json"
	note "registered"
}

write_env_file() {
	[ -n "${CLEVERTHIS_KUBECONFIG:-}${DOCKER_HOST:-}" ] || return 0
	say "Writing $STATE_DIR/agent.env"
	tmpfile=$(mktemp)
	{
		echo "# Written by the CleverThis agent installer."
		[ -z "${CLEVERTHIS_KUBECONFIG:-}" ] || echo "CLEVERTHIS_KUBECONFIG=$CLEVERTHIS_KUBECONFIG"
		[ -z "${DOCKER_HOST:-}" ] || echo "DOCKER_HOST=$DOCKER_HOST"
	} >"$tmpfile"
	as_root cp "$tmpfile" "$STATE_DIR/agent.env"
	as_root chmod 600 "$STATE_DIR/agent.env"
	rm -f "$tmpfile"
	tmpfile=""
}

install_unit() {
	say "Installing the systemd unit $UNIT_PATH"
	tmpfile=$(mktemp)
	unit_template | sed \
		-e "s|@VENV@|$(sed_escape "$VENV")|g" \
		-e "s|@STATE_DIR@|$(sed_escape "$STATE_DIR")|g" \
		-e "s|@MODEL_CACHE@|$(sed_escape "$MODEL_CACHE")|g" >"$tmpfile"
	as_root mkdir -p "$UNIT_DIR"
	as_root cp "$tmpfile" "$UNIT_PATH"
	as_root chmod 644 "$UNIT_PATH"
	rm -f "$tmpfile"
	tmpfile=""
}

start_service() {
	if ! is_true "$DRY_RUN" && ! command -v systemctl >/dev/null 2>&1; then
		warn "systemctl not found: the unit is installed but not started; without systemd run: $VENV/bin/python -m agent run --state-dir $STATE_DIR"
	fi
	service_ctl daemon-reload
	if [ "$UPDATE" = 1 ]; then
		say "Restarting $SERVICE"
		service_ctl enable "$SERVICE"
		service_ctl restart "$SERVICE"
	else
		say "Enabling and starting $SERVICE"
		service_ctl enable --now "$SERVICE"
	fi
}

main() {
	trap cleanup EXIT
	trap 'exit 130' HUP INT TERM
	# Python puts the working directory on sys.path: never let a stray ./agent shadow the installed one.
	cd /
	preflight
	ensure_docker
	ensure_python
	install_agent
	join_cluster
	write_env_file
	install_unit
	start_service
	if is_true "$DRY_RUN"; then
		say "Dry run finished: system commands above were printed, not run"
	else
		say "Done: the agent runs as the systemd unit $SERVICE (logs: journalctl -u $SERVICE -f)"
	fi
}

main "$@"
