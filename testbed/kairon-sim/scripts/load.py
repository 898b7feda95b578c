#!/usr/bin/env python3
"""Creates N Kairon Machines (with a CABPK-like join cloud-config) and times how long until
all are Running, and optionally until their Nodes exist; or deletes them and times that.

  load.py create N [--prefix p] [--namespace ns] [--cluster demo] [--nodes WORKLOAD_KUBECONFIG]
  load.py delete [--prefix p] [--namespace ns] [--nodes WORKLOAD_KUBECONFIG]

Uses kubectl (on PATH) with the current KUBECONFIG. Checks that no InternalIP is handed out
twice and that each Node's providerID is kairon://<uid of its Machine>.
"""
import argparse
import json
import subprocess
import sys
import time

USER_DATA = """## template: jinja
#cloud-config

write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
      apiVersion: kubeadm.k8s.io/v1beta4
      discovery:
        bootstrapToken:
          apiServerEndpoint: 127.0.0.1:6443
          token: abcdef.0123456789abcdef
          unsafeSkipCAVerification: true
      kind: JoinConfiguration
      nodeRegistration:
        kubeletExtraArgs:
        - name: provider-id
          value: kairon://{{ ds.meta_data.instance_id }}
        name: '{{ ds.meta_data.local_hostname }}'
runcmd:
  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml && echo success > /run/cluster-api/bootstrap-success.complete
"""


def kubectl(*args, kubeconfig=None, stdin=None):
    cmd = ["kubectl"] + (["--kubeconfig", kubeconfig] if kubeconfig else []) + list(args)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True).stdout


def machines(ns, prefix):
    items = json.loads(kubectl("get", "machines.kairon.zyvor.dev", "-n", ns, "-o", "json"))["items"]
    return [m for m in items if m["metadata"]["name"].startswith(prefix)]


def nodes(kubeconfig, prefix):
    items = json.loads(kubectl("get", "nodes", "-o", "json", kubeconfig=kubeconfig))["items"]
    return {n["metadata"]["name"]: n for n in items if n["metadata"]["name"].startswith(prefix)}


def wait(what, check, timeout=600):
    start = time.time()
    while True:
        done, total = check()
        if done >= total:
            return time.time() - start
        if time.time() - start > timeout:
            sys.exit(f"timeout waiting for {what}: {done}/{total}")
        time.sleep(0.25)


def create(a):
    items = [
        {
            "apiVersion": "kairon.zyvor.dev/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": f"{a.prefix}{i:04d}", "namespace": a.namespace,
                         "labels": {"cluster.x-k8s.io/cluster-name": a.cluster, "sim-load": a.prefix.strip("-")}},
            "spec": {"image": {"imageRef": "ubuntu-2404-kube-v1.36.1", "diskSize": "40Gi"}, "resources": {"cpu": 2, "memory": "4Gi"},
                     "cloudInit": {"userData": USER_DATA}},
        }
        for i in range(a.count)
    ]
    start = time.time()
    kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    created = time.time() - start
    print(f"created {a.count} machines in {created:.1f}s")

    def running():
        ms = machines(a.namespace, a.prefix)
        return sum(1 for m in ms if m.get("status", {}).get("phase") == "Running"), a.count

    t = wait("Running", running)
    print(f"all {a.count} Running {t:.1f}s after creation finished ({t + created:.1f}s after it began)")
    ms = machines(a.namespace, a.prefix)
    ips = [addr["address"] for m in ms for addr in m["status"]["addresses"] if addr["type"] == "InternalIP"]
    assert len(ips) == len(set(ips)) == a.count, "an address was handed out twice"
    print(f"{len(set(ips))} distinct InternalIPs")
    if a.nodes:
        t2 = wait("Nodes", lambda: (len(nodes(a.nodes, a.prefix)), a.count))
        print(f"all {a.count} Nodes registered {t + t2:.1f}s after creation finished")
        ns_ = nodes(a.nodes, a.prefix)
        for m in ms:
            n = ns_[m["metadata"]["name"]]
            assert n["spec"].get("providerID") == "kairon://" + m["metadata"]["uid"], n["metadata"]["name"]
            ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"][0]
            assert ready["status"] == "True", n["metadata"]["name"]
        print("every Node Ready with providerID kairon://<machine uid>")


def delete(a):
    start = time.time()
    # One deletecollection call: kubectl's client-side rate limit would pace single deletes.
    kubectl("delete", "machines.kairon.zyvor.dev", "-n", a.namespace, "--wait=false", "-l", "sim-load=" + a.prefix.strip("-"))
    t = wait("deletion", lambda: (0 if machines(a.namespace, a.prefix) else 1, 1))
    print(f"all machines gone {time.time() - start:.1f}s after delete began")
    if a.nodes:
        t2 = wait("Node removal", lambda: (0 if nodes(a.nodes, a.prefix) else 1, 1))
        print(f"all Nodes gone {t + t2:.1f}s after machines")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["create", "delete"])
    p.add_argument("count", type=int, nargs="?", default=100)
    p.add_argument("--prefix", default="load-")
    p.add_argument("--namespace", default="default")
    p.add_argument("--cluster", default="demo")
    p.add_argument("--nodes", help="workload kubeconfig: also wait for and check Nodes")
    a = p.parse_args()
    create(a) if a.action == "create" else delete(a)
