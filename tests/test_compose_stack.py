"""The bundled stack (docker-compose.yml) without a Docker engine: every referenced file, port,
volume, variable and command is checked against the repository and the real CLI.

Variables are interpolated the way Compose does (``${VAR}``, ``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?error}``, ``$$``) with the values of ``.env.example``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
PROFILES = ("gpu", "cpu", "fleet")
PREFIXSCOPE_IMAGE_SERVICES = ("ingest-metrics", "ingest-kv-events", "ingest-requests",
                              "ingest-prometheus", "dashboard", "daily-report", "gateway",
                              "ingest-gateway-requests", "ingest-gateway-decisions")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def load_env(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """``KEY=value`` lines of an env file (comments and blank lines skipped)."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=value: {raw!r}"
        env[key.strip()] = value.strip()
    return env


def interpolate(value, env: dict[str, str]):
    """Compose-style interpolation of every string in ``value`` (recursively)."""
    if isinstance(value, dict):
        return {interpolate(k, env): interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        val = env.get(name)
        if op == ":-":
            return val if val else arg
        if op == "-":
            return val if val is not None else arg
        if op in (":?", "?"):
            if (not val) if op == ":?" else val is None:
                raise AssertionError(f"required variable {name} unset: {arg}")
            return val
        return val or ""

    return _VAR.sub(sub, value.replace("$$", "\x00")).replace("\x00", "$")


def referenced_vars(text: str) -> set[str]:
    return {m.group(1) for m in _VAR.finditer(text)}


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return load_env()


@pytest.fixture(scope="module")
def compose(raw, env) -> dict:
    return interpolate(raw, env)


def services_in(compose: dict, profile: str) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items() if profile in s.get("profiles", ())}


def published_ports(service: dict) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of each short-syntax port."""
    out = []
    for p in service.get("ports", []):
        parts = str(p).split(":")
        assert len(parts) == 3, f"port {p!r} must name the host address (HOST_IP:HOST:CONTAINER)"
        out.append((parts[0], int(parts[1]), int(parts[2].split("/")[0])))
    return out


def prefixscope_argv(service: dict) -> list[str] | None:
    """The prefixscope arguments a service runs (entrypoint prefixscope, or via every.sh)."""
    command = service.get("command")
    if command is None:
        return None
    assert isinstance(command, list), "use the list form for commands"
    entry = service.get("entrypoint")
    if entry is None:
        return list(command)
    if "prefixscope" in command:
        return list(command[command.index("prefixscope") + 1:])
    return None


# ----------------------------------------------------------------------------- variables


def test_every_variable_is_in_env_example(env):
    used = referenced_vars(COMPOSE.read_text())
    missing = sorted(used - set(env))
    assert not missing, f".env.example lacks {missing}"


def test_env_example_has_no_unused_variable(env):
    used = referenced_vars(COMPOSE.read_text())
    unused = sorted(set(env) - used)
    assert not unused, f".env.example defines variables docker-compose.yml never uses: {unused}"


def test_env_example_holds_no_secret_value(env):
    for key, value in env.items():
        if any(w in key for w in ("TOKEN", "PASSWORD", "SECRET", "KEY")):
            assert value == "", f"{key} must be empty in .env.example"


def test_required_variables_fail_clearly_without_env(raw):
    with pytest.raises(AssertionError, match="VLLM_MODEL"):
        interpolate(raw["services"]["vllm"]["command"], {})


# ----------------------------------------------------------------------------- profiles, ports


def test_every_service_is_in_a_known_profile(compose):
    for name, s in compose["services"].items():
        profiles = s.get("profiles")
        assert profiles, f"{name} has no profile (a bare `docker compose up` would start it)"
        assert set(profiles) <= set(PROFILES), f"{name}: unknown profile in {profiles}"


@pytest.mark.parametrize("profile", PROFILES)
def test_ports_bind_localhost_and_do_not_collide(compose, profile):
    seen: dict[int, str] = {}
    for name, s in services_in(compose, profile).items():
        for host_ip, host_port, _ in published_ports(s):
            assert host_ip == "127.0.0.1", f"{name} publishes {host_port} on {host_ip}"
            assert host_port not in seen, f"{name} and {seen.get(host_port)} both publish {host_port}"
            seen[host_port] = name


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_profile_has_the_whole_stack(compose, profile):
    names = set(services_in(compose, profile))
    engine = "vllm" if profile == "gpu" else "vllm-cpu"
    assert {engine, "prometheus", "ingest-metrics", "ingest-kv-events", "ingest-requests",
            "dashboard", "daily-report", "mailpit", "gateway", "ingest-gateway-requests",
            "ingest-gateway-decisions"} <= names


def test_fleet_profile_pulls_from_a_query_api(compose):
    names = set(services_in(compose, "fleet"))
    assert "ingest-prometheus" in names and "vllm" not in names and "ingest-metrics" not in names
    argv = prefixscope_argv(compose["services"]["ingest-prometheus"])
    assert argv[:3] == ["ingest", "prometheus", "http://prometheus:9090"]


def test_engine_is_reachable_as_vllm_in_both_profiles(compose):
    cpu = compose["services"]["vllm-cpu"]
    assert "vllm" in cpu["networks"]["default"]["aliases"]
    assert "vllm" in compose["services"]  # the gpu service itself
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["vllm:8000"]
    assert prefixscope_argv(compose["services"]["ingest-metrics"])[2] == "http://vllm:8000/metrics"


def _mount(service: dict, target: str) -> str:
    """The source of the volume a service mounts at ``target``."""
    for v in service.get("volumes", []):
        parts = str(v).split(":")
        if parts[1] == target:
            return parts[0]
    raise AssertionError(f"nothing mounted at {target}")


def test_gateway_sits_between_clients_and_vllm(compose):
    from prefixscope.gateway.auth import load_api_keys
    from prefixscope.gateway.config import load_gateway_config

    gw = compose["services"]["gateway"]
    assert prefixscope_argv(gw) == ["gateway", "--config", "/etc/prefixscope/gateway.toml"]
    assert _mount(gw, "/etc/prefixscope/gateway.toml") == "./deploy/compose/gateway.toml"
    cfg = load_gateway_config(ROOT / "deploy/compose/gateway.toml")
    assert cfg.upstreams == ["http://vllm:8000"] and (cfg.host, cfg.port) == ("0.0.0.0", 8080)
    assert [p[2] for p in published_ports(gw)] == [8080]
    assert "PREFIXSCOPE_HMAC_KEY" in gw["environment"]
    keys = load_api_keys(str(ROOT / "deploy/compose/gateway-keys.toml"))
    assert _mount(gw, cfg.api_keys_file) == "./deploy/compose/gateway-keys.toml" and keys
    # Prometheus scrapes it
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["prefixscope-gateway"]["static_configs"][0]["targets"] == ["gateway:8080"]
    # the ingesters tail the folder the gateway writes its logs to
    logs = _mount(gw, cfg.log_dir)
    req = compose["services"]["ingest-gateway-requests"]
    dec = compose["services"]["ingest-gateway-decisions"]
    assert _mount(req, "/logs/gateway") == _mount(dec, "/logs/gateway") == logs
    assert prefixscope_argv(req)[:2] == ["ingest", "requests"]
    assert set(prefixscope_argv(req)[2:]) == {f"{cfg.log_dir}/usage.jsonl",
                                              f"{cfg.log_dir}/usage.1.jsonl"}
    assert prefixscope_argv(dec) == ["ingest", "decisions", cfg.log_dir]


# ----------------------------------------------------------------------------- vLLM flags


def test_gpu_engine_flags(compose):
    s = compose["services"]["vllm"]
    args = s["command"]
    assert args[0] == "Qwen/Qwen2.5-7B-Instruct"
    assert "--enable-prefix-caching" in args and "--enable-prompt-tokens-details" in args
    kv = [a for a in args if a.startswith("--kv-events-config=")]
    assert len(kv) == 1
    cfg = json.loads(kv[0].split("=", 1)[1])
    assert cfg["enable_kv_cache_events"] is True and cfg["publisher"] == "zmq"
    # '*' makes vLLM bind, so the ingester can connect (vllm/distributed/kv_events.py)
    assert cfg["endpoint"] == "tcp://*:5557" and cfg["replay_endpoint"] == "tcp://*:5558"
    assert "--served-model-name=qwen2.5-7b" in args
    devices = s["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert str(devices[0]["count"]) == "1"
    kv_argv = prefixscope_argv(compose["services"]["ingest-kv-events"])
    assert kv_argv[kv_argv.index("--zmq") + 1] == "tcp://vllm:5557"


def test_cpu_engine_uses_the_repository_recipe(compose):
    s = compose["services"]["vllm-cpu"]
    env = s["environment"]
    assert env["KV_EVENTS_ENDPOINT"] == "tcp://*:5557"
    dockerfile = ROOT / s["build"]["dockerfile"]
    text = dockerfile.read_text()
    assert "vllm-cpu.sh install" in text and "vllm-cpu.sh\", \"serve\"" in text
    assert "build-model" in text


# ----------------------------------------------------------------------------- files, volumes


def _dockerfile_copies(path: Path) -> list[str]:
    srcs = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            srcs.extend(parts[1:-1])
    return srcs


def test_build_contexts_and_copied_files_exist(compose):
    for name, s in compose["services"].items():
        build = s.get("build")
        if not build:
            continue
        context = ROOT / build["context"]
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        for src in _dockerfile_copies(dockerfile):
            assert (context / src).exists(), f"{dockerfile.name}: COPY {src}: not in the repository"


def test_volumes_exist_or_are_declared(compose):
    declared = set(compose.get("volumes") or {})
    used_named = set()
    for name, s in compose["services"].items():
        for v in s.get("volumes", []):
            src = str(v).split(":")[0]
            if src.startswith((".", "/")):
                if src.startswith("./logs"):
                    continue  # the user's usage-log folder (USAGE_LOG_DIR)
                assert (ROOT / src).exists(), f"{name}: bind mount {src} does not exist"
            else:
                assert src in declared, f"{name}: named volume {src} is not declared"
                used_named.add(src)
    assert used_named == declared, f"declared but unused volumes: {declared - used_named}"


def test_scripts_are_valid_shell():
    for script in ("deploy/compose/every.sh", "deploy/bin/vllm-cpu.sh"):
        subprocess.run(["bash", "-n", str(ROOT / script)], check=True)
    subprocess.run(["sh", "-n", str(ROOT / "deploy/compose/every.sh")], check=True)


def test_every_sh_runs_a_command_each_round(tmp_path):
    marker = tmp_path / "rounds"
    proc = subprocess.Popen(["sh", str(ROOT / "deploy/compose/every.sh"), "0.2", "sh", "-c",
                             f"echo x >> {marker}"])
    try:
        import time

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if marker.exists() and len(marker.read_text().splitlines()) >= 2:
                break
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert len(marker.read_text().splitlines()) >= 2


def test_alert_config_points_at_the_mail_catcher(compose):
    import tomllib

    from prefixscope.core.config import load_settings

    path = ROOT / "deploy/compose/prefixscope.toml"
    settings = load_settings(path)
    assert settings.alerts.smtp_host == "mailpit" and settings.alerts.smtp_port == 1025
    assert settings.store.db == compose["x-prefixscope"]["environment"]["PREFIXSCOPE_DB"]
    assert "password" not in tomllib.loads(path.read_text())["alerts"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_is_valid():
    res = subprocess.run(["promtool", "check", "config", str(ROOT / "deploy/prometheus.yml")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# ----------------------------------------------------------------------------- commands


@pytest.mark.parametrize("service", PREFIXSCOPE_IMAGE_SERVICES)
def test_prefixscope_commands_exist_with_these_options(compose, cli, service):
    s = compose["services"][service]
    assert s["image"] == "prefixscope:local" and s["build"]["dockerfile"] == "deploy/Dockerfile"
    argv = prefixscope_argv(s)
    assert argv, f"{service}: runs no prefixscope command"
    # --help is eager: the real parser checks every command word and option name first.
    code, out, err = cli([*argv, "--help"])
    assert code == 0, f"{service}: prefixscope {' '.join(argv)} --help failed: {err}"
    assert "Usage:" in out


def test_dockerfile_entrypoint_is_the_cli():
    text = (ROOT / "deploy/Dockerfile").read_text()
    assert 'ENTRYPOINT ["prefixscope"]' in text


def test_dockerfile_builds_the_wheel_from_every_package_folder_with_the_extension():
    # No Docker engine here: checked statically. The build stage copies every folder that
    # pyproject.toml maps onto a package (a missing one fails `pip wheel .`), setup.py (the
    # compiled replay loops) and installs the compiler and OpenSSL headers they need.
    import tomllib

    text = (ROOT / "deploy/Dockerfile").read_text()
    build = text.split("FROM python:3.11-slim\n")[0]
    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"].values())
    for folder in folders:
        assert f"COPY {folder} ./{folder}" in build, folder
    assert "setup.py" in build and "libssl-dev" in build and "gcc" in build
    assert "pip wheel" in build and "COPY --from=build /wheels /wheels" in text


# ----------------------------------------------------------------------------- docs


def test_deploy_doc_covers_services_variables_and_profiles(raw, env):
    doc = (ROOT / "docs/deploy.md").read_text()
    for name in raw["services"]:
        assert f"`{name}`" in doc, f"docs/deploy.md does not mention service `{name}`"
    for var in env:
        assert f"`{var}`" in doc, f"docs/deploy.md does not mention variable `{var}`"
    for profile in PROFILES:
        assert f"--profile {profile}" in doc
