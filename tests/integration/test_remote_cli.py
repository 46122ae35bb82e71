"""The command line on gs:// and s3:// URLs: `inspect`, `diff` (a remote checkpoint
against a local one), `graph`, `verify` and `migrate`, against fake-gcs-server and moto
(storage_servers.py, module scope). Output names the URL, never the local staged copy; the
TF-free commands stay TF-free on URLs (a child process with TensorFlow blocked), and the
clients' INFO lines stay off the terminal.
"""

import json
import os

import pytest
from storage_servers import (  # noqa: F401
    FakeSleeps,
    FaultProxy,
    gcs_server_fixture,
    s3_server_fixture,
    store_fixture,
    use_env,
)

import objckpt
from objckpt._bundle import remote as _remote

from flavours import dense_bn
from support import cli_in_process, run_cli

BUCKET = "objckpt-cli"
STAGED = "objckpt-staged-"  # the local copies' folder names: never in the output


store = store_fixture(BUCKET)


def template():
    """The template of `objckpt migrate --template` (untrained, optimizer not built)."""
    return dense_bn(7, train=False)


@pytest.fixture(scope="module")
def saved(store, tmp_path_factory):
    """A trained model's checkpoint at a URL prefix (`url`, in the directory `directory`)
    and the same locally (`same`), another model's locally (`other`)."""
    local = tmp_path_factory.mktemp("remote-cli")
    model = dense_bn(1)
    directory = store.folder()
    url = objckpt.save(model, f"{directory}/ckpt-1")
    return {"url": url, "directory": directory,
            "same": objckpt.save(model, str(local / "same")),
            "other": objckpt.save(dense_bn(2), str(local / "other")),
            "count": len(objckpt.tree(model))}


def _cli(capsys, *argv):
    status, out, err = cli_in_process(capsys, *argv)
    assert STAGED not in out + err, out + err
    return status, out, err


def test_inspect_a_url(store, saved, capsys):
    url, count = saved["url"], saved["count"]
    status, out, _ = _cli(capsys, "inspect", url)
    assert status == 0
    assert out.startswith(f"checkpoint {url}: {count} variables")
    assert "moving_mean" in out and "moving_variance" in out
    status, out, _ = _cli(capsys, "inspect", url, "--format", "json")
    listed = json.loads(out)
    assert status == 0 and listed["prefix"] == url and len(listed["variables"]) == count
    # A directory: its newest checkpoint, and a note saying which.
    status, out, err = _cli(capsys, "inspect", saved["directory"])
    assert status == 0 and out.startswith(f"checkpoint {url}: ")
    assert f"used `{url}`" in err
    status, out, err = _cli(capsys, "inspect", f"{saved['directory']}/nothing")
    assert (status, out) == (1, "")
    assert err.startswith(f"objckpt inspect: No checkpoint at `{saved['directory']}/nothing`")


def test_diff_a_url_against_a_local_checkpoint(store, saved, capsys):
    url = saved["url"]
    status, out, _ = _cli(capsys, "diff", url, saved["same"])
    assert status == 0
    assert out.splitlines()[:2] == [f"A: {url}", f"B: {saved['same']}"]
    assert out.splitlines()[-1] == f"{saved['count']} equal, 0 differ (bit-exact)"
    status, out, _ = _cli(capsys, "diff", saved["other"], url, "--format", "json")
    result = json.loads(out)
    assert status == 1 and (result["a"], result["b"]) == (saved["other"], url)
    assert result["differ"] > 0 and not result["only_in_a"] and not result["only_in_b"]


def test_graph_of_a_url(store, saved, capsys):
    status, out, _ = _cli(capsys, "graph", saved["url"])
    assert status == 0
    assert out.startswith("digraph objckpt {")
    assert f'label="{saved["url"]}\\n' in out


def test_verify_a_url(store, saved, capsys):
    status, out, _ = _cli(capsys, "verify", saved["url"])
    assert status == 0
    assert out.startswith(f"OK: {saved['url']}: {saved['count']} tensors")
    status, out, _ = _cli(capsys, "verify", saved["directory"])
    assert status == 0 and out.startswith(f"OK: {saved['url']}: ")


def test_migrate_a_url_to_a_url(store, saved, capsys):
    out_prefix = f"{store.folder()}/migrated/ckpt"
    spec = f"{__name__}:template"
    status, out, _ = _cli(capsys, "migrate", saved["url"], out_prefix, "--template", spec,
                          "--dry-run")
    assert status == 0 and f"plan: checkpoint `{saved['url']}` -> " in out
    assert _remote.listdir(out_prefix.rsplit("/", 1)[0]) == []  # a dry run writes nothing
    status, out, _ = _cli(capsys, "migrate", saved["url"], out_prefix, "--template", spec)
    assert (status, out) == (0, f"wrote {out_prefix}\n")
    status, out, _ = _cli(capsys, "diff", out_prefix, saved["same"])
    assert status == 0, out  # the same values, laid out for the template: the same paths


def test_an_unreachable_endpoint_exits_1_naming_the_url(store, saved, capsys, monkeypatch):
    FakeSleeps().install(monkeypatch)  # the clients' back-off on a fake clock
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    with FaultProxy(store.server) as proxy, use_env(proxy.env):
        proxy.refuse()
        for command in ("inspect", "verify", "graph"):
            status, out, err = _cli(capsys, command, saved["url"])
            assert (status, out) == (1, ""), command
            assert f"`{saved['url']}`" in err and "Fix:" in err, err


@pytest.mark.subprocess
def test_inspect_diff_and_graph_of_urls_import_no_tensorflow(store, saved):
    """As users run it, in a fresh process with TensorFlow, Keras and tf_keras blocked."""
    env = {**os.environ, **store.server.env}
    url = saved["url"]
    found = run_cli("inspect", url, env=env)
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(f"checkpoint {url}: {saved['count']} variables")
    assert "Found credentials" not in found.stderr  # botocore's INFO line
    compared = run_cli("diff", url, saved["same"], env=env)
    assert compared.returncode == 0, compared.stderr
    assert compared.stdout.splitlines()[0] == f"A: {url}"
    drawn = run_cli("graph", saved["directory"], env=env)
    assert drawn.returncode == 0, drawn.stderr
    assert f'label="{url}\\n' in drawn.stdout
    assert STAGED not in found.stdout + compared.stdout + drawn.stdout
