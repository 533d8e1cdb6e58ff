"""A secure Flower deployment on 127.0.0.1, built with the commands of docs/deployment.md:
a CA and a SuperLink certificate (openssl), SuperNode key pairs (ssh-keygen), a SuperLink
with TLS and SuperNode authentication, two registered SuperNodes (``flwr supernode
register``), ``flwr run`` of fedshield configs; two intruders (no key, an unregistered key)
are refused. Subprocesses on free ports, cleanly stopped.

* SCAFFOLD for three rounds, one client per round, the SuperNode of client 0 restarted
  between its two rounds: it resumes from its state file (``state-dir``) and both the
  metrics and every h_m are bit-identical to the simulator's;
* FedCART: its extras (prototypes, counts, head shape) cross the real network and the
  metrics equal the in-process simulator's.

``test_documented_commands_are_the_tested_ones`` checks that every command template below,
rendered with the documentation's values, appears verbatim in docs/deployment.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr")

from test_flower import FEDCART, assert_same, raw_config, simulate

from fedshield import config

# starts processes: one worker with the other such modules (tests/test_suite_setup.py)
pytestmark = pytest.mark.xdist_group("processes")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DOC = REPO / "docs" / "deployment.md"

# -- the deployment steps (docs/deployment.md, "Secure deployment") ----------------------
# Placeholders: {link} (the SuperLink's host name), {san} (the same for the certificate),
# {port}, {i} (partition / SuperNode index), {m} (num-partitions), {node_port}, {state},
# {ca} (absolute path of ca.crt on the user's machine), {app}, {exp}, {out}.
CERTS = [
    "mkdir -p certs keys",
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 "
    '-subj "/CN=fedshield CA" -addext "keyUsage=critical,keyCertSign,cRLSign" '
    "-keyout certs/ca.key -out certs/ca.crt",
    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
    '-subj "/CN={link}" -keyout certs/server.key -out certs/server.csr',
    r'printf "subjectAltName={san}\nkeyUsage=critical,digitalSignature\n'
    r'extendedKeyUsage=serverAuth\n" > certs/server.ext',
    "openssl x509 -req -in certs/server.csr -CA certs/ca.crt -CAkey certs/ca.key "
    "-CAcreateserial -days 365 -extfile certs/server.ext -out certs/server.pem",
]
KEYGEN = 'ssh-keygen -t ecdsa -b 384 -N "" -q -f keys/supernode{i}'
SUPERLINK = (
    "flower-superlink --host 0.0.0.0 --port {port} --disable-runtime-dependency-installation "
    "--ssl-ca-certfile certs/ca.crt --ssl-certfile certs/server.pem "
    "--ssl-keyfile certs/server.key --enable-supernode-auth"
)
CONNECTION = '[superlink.lab]\naddress = "{link}:{port}"\nroot-certificates = "{ca}"\n'
REGISTER = "flwr supernode register keys/supernode{i}.pub lab"
LIST = "flwr supernode list lab"
SUPERNODE = (
    "flower-supernode --superlink {link}:{port} --root-certificates certs/ca.crt "
    "--auth-supernode-private-key keys/supernode{i} --port {node_port} "
    "--node-config \"partition-id={i} num-partitions={m} state-dir='{state}/supernode{i}'\""
)
RUN = "flwr run {app} lab --stream --run-config \"config='{exp}' out='{out}'\""

# The values the documentation shows.
DOC_VALUES = {
    "link": "link.lab",
    "san": "DNS:link.lab",
    "port": "9093",
    "m": "2",
    "node_port": "9094",
    "state": "/var/lib/fedshield",
    "ca": "/home/me/certs/ca.crt",
    "app": ".",
    "exp": "/srv/fedshield/exp.toml",
    "out": "/srv/runs/exp",
    "i": "0",
}


def _flat(text: str) -> str:
    """Shell text with line continuations joined and blanks collapsed."""
    return re.sub(r"\s+", " ", text.replace("\\\n", " "))


def test_documented_commands_are_the_tested_ones():
    doc = _flat(DOC.read_text())
    for template in [*CERTS, KEYGEN, SUPERLINK, REGISTER, LIST, SUPERNODE, RUN]:
        for i in ("0", "1"):  # both SuperNodes' commands
            cmd = _flat(template.format(**{**DOC_VALUES, "i": i}))
            assert cmd in doc, f"docs/deployment.md lacks: {cmd}"
    assert CONNECTION.format(**DOC_VALUES) in DOC.read_text()


# -- processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we created for ``proc`` (its SuperExec and ClientApp
    children included), SIGKILL what is left after 20 s."""
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (SuperExec, ClientApps)
    proc.wait(timeout=10)


class Federation:
    """The processes of one deployment in ``root``; commands run through bash as typed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.values = {
            "link": "127.0.0.1",
            "san": "IP:127.0.0.1",
            "port": str(free_port()),
            "m": "2",
            "state": str(root / "state"),
            "ca": str(root / "certs" / "ca.crt"),
            "app": str(root / "app"),
        }
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO / "src"),
            "FLWR_HOME": str(root / "flwr-home"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "COLUMNS": "200",  # flwr's tables unwrapped
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ports: dict[int, str] = {}

    def cmd(self, template: str, **extra: Any) -> str:
        return template.format(**self.values, **extra)

    def sh(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=self.root, env=self.env, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        return proc

    def start(self, name: str, command: str) -> subprocess.Popen:
        log = (self.root / f"{name}.log").open("w")
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.root, env=self.env, stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() reaches its children
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def supernode(self, i: int) -> subprocess.Popen:
        """SuperNode ``i`` (partition ``i``), on the same Runtime API port when restarted."""
        port = self.node_ports.setdefault(i, str(free_port()))
        return self.start(f"supernode{i}", self.cmd(SUPERNODE, i=i, node_port=port))

    def intruder(self, name: str, key: str | None) -> subprocess.Popen:
        """SuperNode 0's command with another key pair, or with none (``key=None``)."""
        command = self.cmd(SUPERNODE, i=0, node_port=free_port())
        auth = "--auth-supernode-private-key keys/supernode0 "
        command = command.replace(auth, "" if key is None else auth.replace("supernode0", key))
        return self.start(name, command)

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    def logs(self) -> str:
        return "\n".join(f"== {p.stem}\n{p.read_text()[-1500:]}" for p in self.root.glob("*.log"))

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            stop(proc)


def write_app(app: Path) -> None:
    """A minimal Flower app directory with the repository's fedshield components and run
    config keys (``flwr run .`` in a checkout uses the repository's pyproject.toml; this
    one ships no sources in its FAB)."""
    import tomllib

    import tomli_w

    flwr = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    app.mkdir()
    project = {
        "name": "fedshield-deploy-test",
        "version": "0.1.0",
        "description": "fedshield on a local SuperLink",
        "license": "Apache-2.0",
        "dependencies": [],
    }
    tool = {"publisher": "fedshield", "components": flwr["components"], "config": flwr["config"]}
    text = tomli_w.dumps({"project": project, "tool": {"flwr": {"app": tool}}})
    (app / "pyproject.toml").write_text(text)


def start_secure(fed: Federation, nodes: int = 2, intruders: bool = False) -> None:
    """The documented secure deployment in ``fed.root``: certificates, one registered key
    pair per SuperNode, the SuperLink, ``nodes`` SuperNodes (partitions 0..nodes-1); with
    ``intruders``, two SuperNodes that must be refused try while the real ones register.
    The caller stops the processes (``fed.stop_all()``), also when this raises."""
    for tool in ("openssl", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    fed.values["m"] = str(nodes)
    write_app(fed.root / "app")
    home = fed.root / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(fed.cmd(CONNECTION))
    for step in CERTS:
        fed.sh(fed.cmd(step))
    for i in range(nodes):
        fed.sh(fed.cmd(KEYGEN, i=i))
    if intruders:
        fed.sh(fed.cmd(KEYGEN, i=0).replace("keys/supernode0", "keys/intruder"))
    link = fed.start("superlink", fed.cmd(SUPERLINK))
    wait_for_port(int(fed.values["port"]), link)
    if intruders:  # they exit on refusal
        fed.intruder("no-key", None)
        fed.intruder("intruder", "intruder")
    registering = [fed.start(f"register{i}", fed.cmd(REGISTER, i=i)) for i in range(nodes)]
    for proc in registering:
        assert proc.wait(timeout=120) == 0, fed.logs()
    for i in range(nodes):
        fed.supernode(i)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = Federation(tmp_path_factory.mktemp("deploy"))
    try:
        start_secure(fed, nodes=2, intruders=True)
        yield fed
    finally:
        fed.stop_all()


def run_experiment(
    fed: Federation, raw: dict[str, Any], name: str, round_timeout: float | None = None
) -> subprocess.Popen:
    exp, out = fed.root / f"{name}.toml", fed.root / name
    exp.write_text(config.dump(config.validate(raw)))
    command = fed.cmd(RUN, exp=exp, out=out)
    if round_timeout is not None:
        command = command.replace(" out=", f" round-timeout={round_timeout:g} out=")
    return fed.start(f"run-{name}", command)


def finish(fed: Federation, proc: subprocess.Popen, name: str) -> list[dict[str, Any]]:
    rc = proc.wait(timeout=480)
    out = fed.root / name
    assert rc == 0 and (out / "summary.json").exists(), fed.logs()
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def deployment_config(**sections: Any) -> dict[str, Any]:
    """test_flower's config on two clients, both selected unless told otherwise."""
    raw = raw_config(**sections)
    raw["data"]["num_clients"] = 2
    raw["server"]["clients_per_round"] = sections.get("server", {}).get("clients_per_round", 2)
    return raw


@pytest.mark.slow
def test_tls_and_supernode_auth_refuse_intruders(federation):
    fed = federation
    ca = fed.root / "certs" / "ca.crt"
    port = int(fed.values["port"])
    # TLS with the CA's certificate: a client trusting the CA connects, one without fails.
    with socket.create_connection(("127.0.0.1", port)) as raw_sock:
        ctx = ssl.create_default_context(cafile=str(ca))
        with ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    untrusted = ssl.create_default_context()  # the system's CAs only
    with (
        socket.create_connection(("127.0.0.1", port)) as raw_sock,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        untrusted.wrap_socket(raw_sock, server_hostname="127.0.0.1")
    # Node authentication: both intruders are refused and exit.
    for name, reason in (
        ("no-key", "[code: 2001] SuperNode authentication is enabled"),
        ("intruder", "[code: 2004] Failed to activate SuperNode"),
    ):
        assert fed.procs[name].wait(timeout=120) != 0
        assert reason in fed.log(name), fed.log(name)


@pytest.mark.slow
def test_fedcart_over_tls_matches_simulator(federation):
    """A round of FedCART on the two registered SuperNodes: the prototype request, the
    prototypes, class counts and head shape cross the network (the CART step needs all of
    them) and the metrics equal the simulator's. (One round: a second one sends nothing
    new over the network, and each costs a ClientApp process start per node.)"""
    raw = deployment_config(rounds=1, **FEDCART)
    records = finish(federation, run_experiment(federation, raw, "fedcart"), "fedcart")
    assert [r["round"] for r in records] == [1] and "cart/retrain_loss" in records[-1]
    assert_same(simulate(raw), records)
    # The federation holds exactly the two registered SuperNodes, online (no intruder).
    fed = federation
    ids = {re.search(r"SuperNode (\d+) registered", fed.log(f"register{i}"))[1] for i in (0, 1)}
    listed = fed.sh(fed.cmd(LIST)).stdout
    assert set(re.findall(r"(\d{6,})", listed)) == ids, listed
    assert listed.count("online") == 2, listed


@pytest.mark.slow
def test_restarted_supernode_resumes_scaffold_state(federation):
    """Seed 6 selects client 0, 1, 0 in rounds 1-3; SuperNode 0 is stopped and started
    again (same command, same key: same node id) while client 1 trains round 2. Its h_m
    comes back from its state file: metrics and every h_m equal the simulator's."""
    import torch

    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator, sample_cohort

    fed = federation
    raw = deployment_config(
        seed=6, rounds=3, client={"algorithm": "scaffold"},
        server={"algorithm": "scaffold", "clients_per_round": 1},
    )  # fmt: skip
    assert [sample_cohort(6, r, 2, 1) for r in (1, 2, 3)] == [(0,), (1,), (0,)]
    proc = run_experiment(fed, raw, "scaffold")
    metrics = fed.root / "scaffold" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):  # round 1 is recorded
        assert proc.poll() is None and time.monotonic() < deadline, fed.logs()
        time.sleep(0.1)
    stop(fed.procs["supernode0"])
    fed.supernode(0)
    records = finish(fed, proc, "scaffold")
    assert "Failed" not in fed.log("supernode0"), fed.log("supernode0")
    acc = f"acc {records[-1]['test_acc']:.4f}"
    assert re.search(rf"fedshield round 3/3 {acc} \(\d+\.\d s\)", fed.log("run-scaffold"))

    # The SuperNodes train client by client, so the reference does too; they are separate
    # processes whose BLAS may split reductions over a different number of threads, so h_m
    # (a mean of K float32 gradients) agrees to float32 rounding, not bit for bit.
    ref = Simulator(build(config.validate(raw | {"run": {**raw["run"], "vectorize": False}})))
    ref.run()
    assert_same(ref.records, records)
    run_keys = set()
    for k in (0, 1):
        saved = torch.load(
            Path(fed.values["state"]) / f"supernode{k}" / f"client-{k}.pt", weights_only=True
        )
        run_keys.add(saved["run_key"])
        assert saved["round"] == (3 if k == 0 else 2)
        want = ref.state.client_states[k]["h"]
        scale = float(want.abs().max())
        torch.testing.assert_close(saved["state"]["h"], want, rtol=1e-4, atol=1e-5 * scale)
    assert len(run_keys) == 1


def test_app_config_is_a_valid_flower_app():
    """pyproject.toml declares the fedshield components (``flwr run .`` works)."""
    import tomllib

    from flwr.cli.config_utils import load_and_validate

    load_and_validate(REPO / "pyproject.toml", check_module=False)  # raises if invalid
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    components = cfg["tool"]["flwr"]["app"]["components"]
    assert components == {
        "serverapp": "fedshield.flower.server_app:app",
        "clientapp": "fedshield.flower.client_app:app",
    }
