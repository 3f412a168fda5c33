"""Static checks of the deployment files: docker-compose.yml, the Flink image
(deploy/flink/Dockerfile), the cluster configuration (flink-conf/config.yaml)
and the job configuration used on the cluster (deploy/cluster.toml).

No container is started here (this needs no Docker engine). The compose file
is validated against the Compose Specification's JSON schema, and every file
that the compose file, the Dockerfile or the service commands name must exist
in the repository, so renaming one of them without updating the deployment
fails here.

Where does the Compose schema come from?
----------------------------------------
The schema is the upstream ``compose-spec.json`` (the one ``docker compose``
itself validates with), as vendored by the PyPI package ``check-jsonschema``
(``check_jsonschema/builtin_schemas/vendor/compose-spec.json``). That package
is maintained and refreshes its vendored copy with each release, unlike the
retired ``docker-compose`` 1.x (whose ``compose_spec.json`` dates from 2021
and whose pins would clash with ours). In order of preference:

1. ``check-jsonschema`` is installed (it is in the project's test extras):
   the file is read straight from the installed package. No network.
2. A copy cached by an earlier run under
   ``.cache/compose-spec/check-jsonschema-<version>/compose-spec.json``.
3. Otherwise ``pip download`` fetches the pinned wheel (hash-checked with
   ``--require-hashes``), the JSON is extracted, checked against its pinned
   sha256 and cached as in 2. Only this step needs PyPI.

The package is never imported, only its data file is read, so its own
dependencies do not matter here. If none of the three works the test fails
(it is never skipped). ``docker compose config -q`` is run in addition where
the Docker CLI has the compose plugin.
"""

from __future__ import annotations

import copy
import glob
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
FLINK_CONF = REPO / "flink-conf" / "config.yaml"
CLUSTER_TOML = REPO / "deploy" / "cluster.toml"

# Fallback download of the schema (see the module docstring). Bump all three
# together: `pip download --no-deps check-jsonschema==X`, then sha256sum the
# wheel and the extracted builtin_schemas/vendor/compose-spec.json.
SCHEMA_PACKAGE = "check-jsonschema"
SCHEMA_PACKAGE_VERSION = "0.39.0"
SCHEMA_WHEEL_SHA256 = "14ce5c94871c551268ea948ffe21e9f1464dc48fb20bf9a4c13deeaaf756cf9b"
SCHEMA_JSON_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
SCHEMA_MEMBER = "check_jsonschema/builtin_schemas/vendor/compose-spec.json"
SCHEMA_CACHE = (
    REPO / ".cache" / "compose-spec" / f"{SCHEMA_PACKAGE}-{SCHEMA_PACKAGE_VERSION}" / "compose-spec.json"
)

FLINK_SERVICES = ("jobmanager", "taskmanager", "topics-init", "submit-job")


# --------------------------------------------------------------------------- helpers


def _load_yaml(path: Path):
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def compose() -> dict:
    data = _load_yaml(COMPOSE_FILE)
    assert isinstance(data, dict), "docker-compose.yml must be a mapping"
    return data


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _schema_from_installed_package() -> dict | None:
    # find_spec does not import the package (only locates it).
    spec = importlib.util.find_spec("check_jsonschema")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "builtin_schemas" / "vendor" / "compose-spec.json"
        if candidate.is_file():
            return json.loads(candidate.read_text(encoding="utf-8"))
    return None


def _download_schema() -> bytes:
    """compose-spec.json out of the pinned, hash-checked check-jsonschema wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(
            f"{SCHEMA_PACKAGE}=={SCHEMA_PACKAGE_VERSION} --hash=sha256:{SCHEMA_WHEEL_SHA256}\n",
            encoding="utf-8",
        )
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--require-hashes", "--disable-pip-version-check", "-q", "-d", tmp, "-r", str(req)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        wheels = glob.glob(os.path.join(tmp, "check_jsonschema-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one check_jsonschema wheel, got {wheels}")
        with zipfile.ZipFile(wheels[0]) as zf:
            raw = zf.read(SCHEMA_MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SCHEMA_JSON_SHA256:
        raise RuntimeError(f"compose-spec.json sha256 {digest} != pinned {SCHEMA_JSON_SHA256}")
    return raw


def _cached_schema() -> bytes | None:
    try:
        raw = SCHEMA_CACHE.read_bytes()
    except OSError:
        return None
    return raw if hashlib.sha256(raw).hexdigest() == SCHEMA_JSON_SHA256 else None


def _store_in_cache(raw: bytes) -> None:
    """Best effort: a read-only checkout still validates, it just downloads again."""
    try:
        SCHEMA_CACHE.parent.mkdir(parents=True, exist_ok=True)
        partial = SCHEMA_CACHE.with_suffix(f".json.{os.getpid()}.part")
        partial.write_bytes(raw)
        os.replace(partial, SCHEMA_CACHE)  # atomic: concurrent runs never read half a file
    except OSError:
        pass


@pytest.fixture(scope="module")
def compose_schema() -> dict:
    schema = _schema_from_installed_package()
    if schema is None:
        raw = _cached_schema()
        if raw is None:
            try:
                raw = _download_schema()
            except Exception as exc:  # noqa: BLE001 - reported as a test failure, never a skip
                pytest.fail(
                    "Compose Specification schema unavailable: install the test extras "
                    f"(pip install {SCHEMA_PACKAGE}) or let pip reach PyPI.\n{exc}"
                )
            _store_in_cache(raw)
        schema = json.loads(raw)
    assert schema.get("title") == "Compose Specification", "unexpected schema file"
    return schema


def _schema_errors(schema: dict, document: dict) -> list[str]:
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)
    return [
        f"{'/'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
        for err in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    ]


def _dockerfile_path(service: dict) -> tuple[Path, Path]:
    build = service["build"]
    if isinstance(build, str):
        build = {"context": build}
    context = (REPO / build.get("context", ".")).resolve()
    dockerfile = (context / build.get("dockerfile", "Dockerfile")).resolve()
    return context, dockerfile


def _dockerfile_instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in dockerfile.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    return instructions[starts[-1] :]


def _copy_args(rest: str) -> tuple[dict[str, str], list[str]]:
    flags: dict[str, str] = {}
    words = shlex.split(rest)
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words


def _repo_copy_destination(dockerfile: Path) -> str:
    """Where the final image stage puts the whole build context (`COPY . DEST`)."""
    dests = [
        words[-1]
        for word, rest in _final_stage(_dockerfile_instructions(dockerfile))
        if word == "COPY"
        for flags, words in [_copy_args(rest)]
        if "from" not in flags and words[:-1] == ["."]
    ]
    assert dests, f"{dockerfile} does not copy the repository into the image (COPY . DEST)"
    return dests[-1].rstrip("/")


def _command_tokens(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _flatten(tree, prefix: str = "") -> dict:
    """Flink reads nested and flat (dotted) YAML keys alike: normalise to flat."""
    flat: dict = {}
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, full + "."))
        else:
            flat[full] = value
    return flat


@pytest.fixture(scope="module")
def flink_conf() -> dict:
    data = _load_yaml(FLINK_CONF)
    assert isinstance(data, dict)
    return _flatten(data)


# --------------------------------------------------------------- schema validation


def test_compose_file_matches_compose_spec_schema(compose, compose_schema):
    errors = _schema_errors(compose_schema, compose)
    assert not errors, "docker-compose.yml violates the Compose Specification:\n" + "\n".join(errors)


def test_schema_is_not_vacuous(compose, compose_schema):
    # Guard against a schema that accepts anything (wrong file, broken $refs).
    broken = copy.deepcopy(compose)
    broken["services"]["kafka"]["imagee"] = broken["services"]["kafka"].pop("image")
    broken["services"]["jobmanager"]["depends_on"] = {"kafka": {"condition": "service_ready"}}
    errors = _schema_errors(compose_schema, broken)
    assert any("imagee" in e for e in errors), errors
    assert any("service_ready" in e for e in errors), errors


def _compose_command() -> list[str] | None:
    """`docker compose` (the CLI plugin) or `docker-compose` (Debian's package: validates a file
    without an engine); `make setup` installs the latter."""
    if shutil.which("docker") is not None:
        try:
            if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
                return ["docker", "compose"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return ["docker-compose"] if shutil.which("docker-compose") is not None else None


def _compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = _compose_command()
    assert command is not None, "neither `docker compose` nor `docker-compose`: run `make setup`"
    return subprocess.run(
        [*command, "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"} | env,
    )


def test_docker_compose_config_accepts_file():
    proc = _compose_config({"GRAFANA_ADMIN_PASSWORD": "a-long-password"})
    assert proc.returncode == 0, proc.stderr


def test_docker_compose_config_wants_the_grafana_password():
    proc = _compose_config({})
    assert proc.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in proc.stderr


# ------------------------------------------------------------- services and wiring


def test_expected_services_present(services):
    assert {"kafka", *FLINK_SERVICES} <= set(services)


def test_flink_services_share_the_project_image(services):
    contexts = {svc: _dockerfile_path(services[svc]) for svc in FLINK_SERVICES}
    images = {services[svc].get("image") for svc in FLINK_SERVICES}
    assert len(set(contexts.values())) == 1, contexts
    assert len(images) == 1, images
    assert services["jobmanager"]["command"] in ("jobmanager", ["jobmanager"])
    assert services["taskmanager"]["command"] in ("taskmanager", ["taskmanager"])


def test_build_contexts_and_dockerfiles_exist(services):
    built = [name for name, svc in services.items() if "build" in svc]
    assert built, "no service builds the project image"
    for name in built:
        context, dockerfile = _dockerfile_path(services[name])
        assert context.is_dir(), f"{name}: build context {context} missing"
        assert dockerfile.is_file(), f"{name}: Dockerfile {dockerfile} missing"
        assert REPO in (context, *context.parents), f"{name}: context outside the repository"


def test_dockerfile_copy_sources_exist(services):
    """Every `COPY <src> ...` from the build context names files in the repo."""
    checked = 0
    for context, dockerfile in {_dockerfile_path(s) for s in services.values() if "build" in s}:
        for word, rest in _dockerfile_instructions(dockerfile):
            if word not in ("COPY", "ADD"):
                continue
            flags, words = _copy_args(rest)
            if "from" in flags:
                continue
            for src in words[:-1]:
                matches = glob.glob(str(context / src))
                assert matches, f"{dockerfile.relative_to(REPO)}: COPY source {src!r} not in the repo"
                checked += 1
    assert checked >= 3  # pom.xml, connector, flink-conf/config.yaml, the repository


def test_dockerfile_installs_what_the_cluster_needs(services):
    _, dockerfile = _dockerfile_path(services["jobmanager"])
    text = dockerfile.read_text(encoding="utf-8")
    instructions = _dockerfile_instructions(dockerfile)
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert any(f.startswith("maven:3.9-eclipse-temurin-17") for f in froms), froms
    assert re.search(r"ARG FLINK_IMAGE=flink:2\.2\.1-(scala_2\.12-)?java17\b", text)
    assert "mvn -q -B package" in text
    final = _final_stage(instructions)
    copies = [_copy_args(rest) for word, rest in final if word == "COPY"]
    assert any(
        f.get("from") == "jars"
        and w[-1].rstrip("/") == "/opt/flink/lib"
        and w[0].endswith("/.cache/jars/flink/*.jar")
        for f, w in copies
    ), "connector jars are not copied into /opt/flink/lib"
    assert any(w == ["flink-conf/config.yaml", "/opt/flink/conf/config.yaml"] for _, w in copies), (
        "flink-conf/config.yaml is not baked into the image"
    )
    assert re.search(r"cp /opt/flink/opt/flink-python-\*\.jar /opt/flink/lib/", text)
    # The jar list the maven stage produces is the one pom.xml writes.
    pom = (REPO / "pom.xml").read_text(encoding="utf-8")
    assert "<artifactId>notify-dedup-connector</artifactId>" in pom
    assert "<artifactId>flink-sql-connector-kafka</artifactId>" in pom
    assert "${jars.dir}/flink" in pom


def test_bind_mounts_and_referenced_files_exist(compose, services):
    declared_volumes = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            if isinstance(vol, str):
                source, _, rest = vol.partition(":")
                kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            else:
                source, kind = vol.get("source", ""), vol.get("type", "volume")
            if kind == "bind":
                path = (REPO / source).resolve()
                assert path.exists(), f"{name}: bind-mounted {source} missing"
            elif source:
                assert source in declared_volumes, f"{name}: volume {source} not declared"
        env_files = svc.get("env_file", [])
        for env_file in [env_files] if isinstance(env_files, (str, dict)) else env_files:
            path = env_file["path"] if isinstance(env_file, dict) else env_file
            required = env_file.get("required", True) if isinstance(env_file, dict) else True
            if required:
                assert (REPO / path).is_file(), f"{name}: env_file {path} missing"
    for section in ("configs", "secrets"):
        for key, item in (compose.get(section) or {}).items():
            if "file" in item:
                assert (REPO / item["file"]).exists(), f"{section}.{key}: {item['file']} missing"


def test_image_paths_in_commands_map_to_repo_files(services):
    """Paths under the image's copy of the repository must exist in the repo."""
    _, dockerfile = _dockerfile_path(services["jobmanager"])
    root = _repo_copy_destination(dockerfile)
    seen = []
    for name, svc in services.items():
        for token in _command_tokens(svc.get("entrypoint")) + _command_tokens(svc.get("command")):
            if token.startswith(root + "/"):
                rel = PurePosixPath(token).relative_to(root)
                assert (REPO / rel).is_file(), f"{name}: {token} -> {rel} not in the repo"
                seen.append(str(rel))
    assert "jobs/dedup_job.py" in seen
    assert "deploy/cluster.toml" in seen


def test_submit_job_command(services):
    svc = services["submit-job"]
    cmd = _command_tokens(svc.get("entrypoint")) + _command_tokens(svc["command"])
    assert cmd[:2] == ["flink", "run"], cmd
    assert cmd[cmd.index("-m") + 1] == "jobmanager:8081"
    assert "-d" in cmd
    job = cmd[cmd.index("-py") + 1]
    assert job.endswith("/jobs/dedup_job.py")
    # Program arguments follow the Python file; `--config PATH` is main()'s.
    assert cmd.index("--config") > cmd.index("-py")
    assert cmd[cmd.index("--config") + 1].endswith("/deploy/cluster.toml")
    for flag in ("-pyexec", "-pyclientexec"):
        if flag in cmd:
            assert cmd[cmd.index(flag) + 1].startswith("/"), f"{flag} wants an absolute path"
    deps = svc["depends_on"]
    assert deps["topics-init"]["condition"] == "service_completed_successfully"
    assert deps["jobmanager"]["condition"] in ("service_started", "service_healthy")


def test_topics_init_runs_the_project_cli(services):
    svc = services["topics-init"]
    cmd = _command_tokens(svc.get("entrypoint")) + _command_tokens(svc.get("command"))
    assert cmd[:3] == ["dedupctl", "topics", "create"], cmd
    assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert svc["environment"]["DEDUP_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    # The console script must be declared by the package the image installs.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    scripts = pyproject.get("project", {}).get("scripts", {})
    assert "dedupctl" in scripts, "pyproject.toml declares no `dedupctl` console script"
    deps = " ".join(pyproject.get("project", {}).get("dependencies", []))
    assert re.search(r"apache-flink\s*==\s*2\.2\.1", deps), deps


def test_kafka_service(services):
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    env = {k: str(v) for k, v in kafka["environment"].items()}
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert "healthcheck" in kafka
    # The data directory is on the named volume.
    assert any(v.split(":")[1] == env["KAFKA_LOG_DIRS"] for v in kafka["volumes"]), kafka["volumes"]
    # Whatever the Flink services use as bootstrap servers, the broker advertises.
    for name in FLINK_SERVICES:
        bootstrap = services[name]["environment"]["DEDUP_KAFKA_BOOTSTRAP_SERVERS"]
        assert f"PLAINTEXT://{bootstrap}" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")


def test_checkpoint_volume_is_shared(services, flink_conf):
    def mount_of(svc: str, target: str) -> str | None:
        for vol in services[svc].get("volumes", []):
            source, _, dest = vol.partition(":")
            if dest.split(":")[0] == target:
                return source
        return None

    for target, key in (
        ("/data/checkpoints", "execution.checkpointing.dir"),
        ("/data/savepoints", "execution.checkpointing.savepoint-dir"),
    ):
        jm, tm = mount_of("jobmanager", target), mount_of("taskmanager", target)
        assert jm and jm == tm, f"{target} must be the same named volume on jobmanager and taskmanager"
        assert flink_conf[key] == f"file://{target}"


# ------------------------------------------------------------------- exposure


def _published(service: dict) -> list[tuple[str | None, str]]:
    """(host address, container port) of each published port, short or long syntax."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip"), str(port["target"])))
            continue
        parts = str(port).split(":")
        out.append((parts[0] if len(parts) == 3 else None, parts[-1].split("/")[0]))
    return out


def test_ports_are_published_on_loopback_only(services):
    published = {name: _published(svc) for name, svc in services.items() if svc.get("ports")}
    assert {"kafka", "jobmanager", "grafana", "prometheus"} <= set(published)
    for name, ports in published.items():
        for host, target in ports:
            assert host == "127.0.0.1", f"{name}: port {target} is published on every interface"


def test_flink_web_submission_is_disabled(services, flink_conf):
    for name in ("jobmanager", "taskmanager", "submit-job"):
        props = services[name]["environment"]["FLINK_PROPERTIES"]
        parsed = dict(
            (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in props.splitlines()) if k.strip()
        )
        assert parsed.get("web.submit.enable") == "false", (name, parsed)
    assert flink_conf.get("web.submit.enable", False) is False


def test_grafana_admin_password_comes_from_the_environment_without_a_default(services):
    env = services["grafana"]["environment"]
    assert re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]+\}", env["GF_SECURITY_ADMIN_PASSWORD"]), env
    assert "GF_SECURITY_ADMIN_USER" not in env or env["GF_SECURITY_ADMIN_USER"] != "admin"
    assert str(env.get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer")) == "Viewer"  # anonymous users only look


def _dockerignore(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, pattern) in order, as Docker reads a .dockerignore (last match wins)."""
    rules = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex = "".join(
            ".*" if part == "**" else re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
            for part in re.split(r"(\*\*)", pattern)
        )
        rules.append((not negate, re.compile(regex.replace(".*/", "(.*/)?") + "$")))
    return rules


def _excluded(rules: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """A path is out of the context when it, or a folder above it, is excluded."""
    parts = path.split("/")
    out = False
    for exclude, regex in rules:
        if any(regex.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            out = exclude
    return out


@pytest.mark.parametrize("ignore_file", [REPO / ".dockerignore", REPO / "deploy" / "flink" / "Dockerfile.dockerignore"])
def test_the_build_context_leaves_out_data_caches_and_secrets(ignore_file: Path, services):
    rules = _dockerignore(ignore_file)
    for path in (
        ".data/kafka/data/notifications.sms-0/00000000000000000000.log",  # one-time codes
        ".data/senders/status.sqlite3",
        ".cache/jars/kafka/kafka_2.13-4.1.1.jar",
        ".venv/bin/python",
        ".env",  # GRAFANA_ADMIN_PASSWORD
        ".git/config",
        "senders/__pycache__/x.cpython-311.pyc",
    ):
        assert _excluded(rules, path), f"{ignore_file.name} lets {path} into the image"
    _, dockerfile = _dockerfile_path(services["jobmanager"])
    for word, rest in _dockerfile_instructions(dockerfile):
        if word == "COPY" and "from" not in _copy_args(rest)[0]:
            for src in _copy_args(rest)[1][:-1]:
                if src != ".":
                    assert not _excluded(rules, src), f"{ignore_file.name} leaves out {src}, which the image needs"
    for needed in ("pyproject.toml", "senders/runtime/worker.py", "jobs/dedup_job.py", "deploy/cluster.toml"):
        assert not _excluded(rules, needed), needed


def test_flink_ports_published(services):
    ports = [str(p) for p in services["jobmanager"]["ports"]]
    assert any(p.split(":")[-1] == "8081" for p in ports), ports
    assert any(p.split(":")[-1] == "9249" for p in ports), ports


def test_flink_properties_point_at_jobmanager(services):
    for name in ("jobmanager", "taskmanager", "submit-job"):
        props = services[name]["environment"]["FLINK_PROPERTIES"]
        parsed = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in props.splitlines())
            if k.strip()
        )
        assert parsed.get("jobmanager.rpc.address") == "jobmanager", (name, parsed)


def test_cluster_toml(services, flink_conf):
    cfg = tomllib.loads(CLUSTER_TOML.read_text(encoding="utf-8"))
    assert set(cfg) <= {"kafka", "flink", "dedup", "topics"}, set(cfg)
    assert cfg["kafka"]["bootstrap_servers"] == "kafka:9092"
    assert cfg["flink"]["checkpoint_dir"] == flink_conf["execution.checkpointing.dir"]
    parallelism = cfg["flink"]["parallelism"]
    assert isinstance(parallelism, int) and 1 <= parallelism <= int(
        flink_conf["taskmanager.numberOfTaskSlots"]
    )
    env = services["submit-job"]["environment"]
    assert env["DEDUP_FLINK_CHECKPOINT_DIR"] == cfg["flink"]["checkpoint_dir"]


def test_cluster_toml_loads_with_the_project_loader():
    """The job reads deploy/cluster.toml with settings: no unknown keys."""
    config = pytest.importorskip("settings")
    cfg = config.load_settings(CLUSTER_TOML, env={})
    assert cfg.kafka.bootstrap_servers == "kafka:9092"
    assert cfg.flink.checkpoint_uri() == "file:///data/checkpoints"
    # What the compose services set in their environment says the same.
    env = {
        "DEDUP_KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
        "DEDUP_FLINK_CHECKPOINT_DIR": "file:///data/checkpoints",
    }
    assert config.load_settings(None, env=env).flink.checkpoint_dir == cfg.flink.checkpoint_dir


# Python of the image's base (apt's python3). flink:2.2.x images are built on
# Ubuntu 24.04 (noble): Python 3.12. Update when FLINK_IMAGE changes.
IMAGE_PYTHON = {"flink:2.2.1-java17": "3.12.3", "flink:2.2.1-scala_2.12-java17": "3.12.3"}


def test_project_installs_on_the_image_python(services):
    from packaging.specifiers import SpecifierSet

    _, dockerfile = _dockerfile_path(services["jobmanager"])
    image = re.search(r"^ARG FLINK_IMAGE=(\S+)", dockerfile.read_text(encoding="utf-8"), re.M).group(1)
    assert image in IMAGE_PYTHON, f"unknown Python version of {image}: add it to IMAGE_PYTHON"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    requires = pyproject["project"].get("requires-python", "")
    assert SpecifierSet(requires).contains(IMAGE_PYTHON[image]), (
        f"pip install of the project in {image} (python {IMAGE_PYTHON[image]}) "
        f"would fail: requires-python = {requires!r}"
    )


# ---------------------------------------------------------------- Flink config.yaml


def test_flink_conf_key_settings(flink_conf):
    c = flink_conf
    assert c["state.backend.type"] == "rocksdb"
    assert c["execution.checkpointing.incremental"] is True
    assert c["execution.checkpointing.dir"] == "file:///data/checkpoints"
    assert c["execution.checkpointing.savepoint-dir"] == "file:///data/savepoints"
    assert c["execution.checkpointing.externalized-checkpoint-retention"] == "RETAIN_ON_CANCELLATION"
    assert c["execution.checkpointing.num-retained"] == 3
    assert c["execution.checkpointing.interval"] == "500ms"
    assert c["execution.checkpointing.min-pause"] == "250ms"
    assert c["execution.checkpointing.mode"] == "EXACTLY_ONCE"
    assert c["restart-strategy.type"] in ("exponential-delay", "fixed-delay")
    if c["restart-strategy.type"] == "fixed-delay":
        assert int(c["restart-strategy.fixed-delay.attempts"]) > 0
    else:
        assert int(c["restart-strategy.exponential-delay.attempts-before-reset-backoff"]) > 0
    assert c["python.execution-mode"] == "thread"
    assert c["python.executable"] == "python3"
    assert c["python.client.executable"] == "python3"
    assert c["taskmanager.numberOfTaskSlots"] == 2
    assert c["jobmanager.memory.process.size"] == "1600m"
    assert c["taskmanager.memory.process.size"] == "2048m"
    assert c["jobmanager.rpc.address"] == "jobmanager"
    assert c["rest.address"] == "jobmanager"
    for key in ("estimate-num-keys", "estimate-live-data-size", "total-sst-files-size"):
        assert c[f"state.backend.rocksdb.metrics.{key}"] is True
    # Java 17 needs the distribution's --add-opens/--add-exports.
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in c["env.java.opts.all"]


def test_flink_conf_prometheus_reporter(flink_conf, services):
    reporters = [r.strip() for r in str(flink_conf.get("metrics.reporters", "prom")).split(",")]
    assert "prom" in reporters
    assert (
        flink_conf["metrics.reporter.prom.factory.class"]
        == "org.apache.flink.metrics.prometheus.PrometheusReporterFactory"
    )
    port = str(flink_conf["metrics.reporter.prom.port"])
    for name in ("jobmanager", "taskmanager"):
        published = [str(p).split(":")[-1] for p in services[name].get("ports", [])]
        assert port in published, f"{name} does not publish the Prometheus port {port}"


def test_flink_conf_uses_no_flink_1x_keys(flink_conf):
    legacy = {
        "state.backend",
        "state.checkpoints.dir",
        "state.savepoints.dir",
        "state.backend.incremental",
        "state.checkpoints.num-retained",
        "restart-strategy",
        "execution.checkpointing.externalized-checkpoint-cleanup",
        "metrics.reporter.prom.class",
    }
    assert not legacy & set(flink_conf), sorted(legacy & set(flink_conf))


_FLINK_KEY_CHECK = textwrap.dedent(
    """
    import json, sys
    from pyflink.java_gateway import get_gateway
    jvm = get_gateway().jvm
    keys = json.loads(sys.stdin.read())
    classes = [
        "org.apache.flink.configuration." + n for n in (
            "CheckpointingOptions", "StateBackendOptions", "StateRecoveryOptions", "RestartStrategyOptions",
            "JobManagerOptions", "TaskManagerOptions", "RestOptions", "BlobServerOptions", "CoreOptions",
            "MetricOptions", "ExecutionOptions", "RpcOptions", "PipelineOptions", "HeartbeatManagerOptions")
    ] + ["org.apache.flink.state.rocksdb.RocksDBNativeMetricOptions",
         "org.apache.flink.state.rocksdb.RocksDBOptions", "org.apache.flink.python.PythonOptions"]
    current, deprecated = set(), set()
    dep = jvm.java.lang.Class.forName("java.lang.Deprecated")
    for name in classes:
        for field in jvm.java.lang.Class.forName(name).getFields():
            if field.getType().getName() != "org.apache.flink.configuration.ConfigOption":
                continue
            option = field.get(None)
            (deprecated if field.isAnnotationPresent(dep) else current).add(option.key())
            deprecated.update(k.getKey() for k in option.fallbackKeys())
    print(json.dumps({k: ("ok" if k in current else "deprecated" if k in deprecated else "unknown")
                      for k in keys}))
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("pyflink") is None or shutil.which("java") is None,
    reason="needs PyFlink and a Java runtime",
)
def test_flink_conf_keys_are_current_flink_options(flink_conf):
    """Ask Flink 2.2 itself (its ConfigOption classes) whether each key exists: of config.yaml,
    and of every other environment settings/flink_conf.py configures (the job's mini-cluster,
    the standalone cluster of the harness).

    Runs in a subprocess so that this JVM never shares state with the job's tests.
    Reporter keys (metrics.reporter.<name>.*) are per-plugin and checked above.
    """
    from settings import Settings
    from settings.flink_conf import mini_cluster, standalone

    others = {**mini_cluster(Settings()), **standalone(Settings(), rest_port=1, rpc_port=2, slots=1, java_opts="")}
    keys = sorted(k for k in {*flink_conf, *others} if not k.startswith("metrics.reporter."))
    proc = subprocess.run(
        [sys.executable, "-c", _FLINK_KEY_CHECK],
        input=json.dumps(keys),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = {k: v for k, v in verdicts.items() if v != "ok"}
    assert not bad, f"not current Flink 2.2 options: {bad}"


# ------------------------------------------------------- monitoring: Prometheus and Grafana
# (the contents of deploy/prometheus and deploy/grafana: tests/deploy/test_monitoring.py)

MONITORING_SERVICES = ("prometheus", "grafana")


def _bind_mounts(service: dict) -> dict[str, Path]:
    """Container path -> repository path of a service's bind mounts (short syntax)."""
    mounts = {}
    for vol in service.get("volumes", []):
        source, _, rest = vol.partition(":")
        if source.startswith((".", "/")):
            mounts[rest.split(":")[0]] = (REPO / source).resolve()
    return mounts


def _in_container(mounts: dict[str, Path], path: str) -> Path | None:
    """The repository file a container path resolves to through the bind mounts, if any."""
    for target, source in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if path == target:
            return source
        if path.startswith(target.rstrip("/") + "/"):
            return source / PurePosixPath(path).relative_to(target)
    return None


def test_monitoring_services_present_with_pinned_images(services):
    for name in MONITORING_SERVICES:
        image = services[name]["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image version ({image})"
    assert services["prometheus"]["image"].startswith("prom/prometheus:v3")
    assert services["grafana"]["image"].startswith("grafana/grafana:")


def test_prometheus_mounts_its_config_and_rules(services, flink_conf):
    svc = services["prometheus"]
    mounts = _bind_mounts(svc)
    flags = dict(t.split("=", 1) for t in _command_tokens(svc["command"]) if "=" in t)
    config_file = _in_container(mounts, flags["--config.file"])
    assert config_file is not None and config_file.is_file(), f"{flags['--config.file']} is not mounted"
    config = _load_yaml(config_file)
    rule_files = config.get("rule_files") or []
    assert rule_files, "prometheus.yml loads no alert rules"
    for rule_file in rule_files:
        local = _in_container(mounts, rule_file)
        assert local is not None and local.is_file(), f"rule file {rule_file} is not mounted"
    # both Flink processes are scraped on the reporter port of flink-conf/config.yaml
    port = int(flink_conf["metrics.reporter.prom.port"])
    targets = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets |= set(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets |= {f"{n}:{dns['port']}" for n in dns["names"]}
    assert {f"jobmanager:{port}", f"taskmanager:{port}"} <= targets, targets
    assert any(t.split(":")[-1] == "9090" for t in map(str, svc["ports"]))


def test_grafana_mounts_its_provisioning_and_dashboards(services):
    svc = services["grafana"]
    mounts = _bind_mounts(svc)
    provisioning = _in_container(mounts, "/etc/grafana/provisioning")
    assert provisioning is not None and provisioning.is_dir(), "Grafana provisioning is not mounted"
    sources = [
        d for f in sorted((provisioning / "datasources").glob("*.yml")) for d in _load_yaml(f)["datasources"]
    ]
    assert [d["url"] for d in sources] == ["http://prometheus:9090"]
    assert "prometheus" in services and "prometheus" in svc.get("depends_on", [])
    providers = [
        p for f in sorted((provisioning / "dashboards").glob("*.yml")) for p in _load_yaml(f)["providers"]
    ]
    assert providers, "no dashboard provider"
    for provider in providers:
        folder = _in_container(mounts, provider["options"]["path"])
        assert folder is not None and folder.is_dir(), f"{provider['options']['path']} is not mounted"
        assert sorted(folder.glob("*.json")), f"no dashboard in {folder}"
    home = svc.get("environment", {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        found = _in_container(mounts, home)
        assert found is not None and found.is_file(), f"home dashboard {home} is not mounted"


def test_monitoring_volumes_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name in MONITORING_SERVICES:
        for vol in services[name].get("volumes", []):
            source = vol.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name}: volume {source} not declared"
