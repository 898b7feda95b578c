// Command kairon-guest plays the parts of a control-plane VM that the Kairon simulator
// (testbed/kairon-sim) does not run as upstream binaries: what `kubeadm` computes on the VM
// (certificates from the CAs that the bootstrap data carries, joining the etcd cluster) and
// kubelet's port-forward endpoint, which is what the API server's `pods/portforward` reaches
// and what KubeadmControlPlane uses to talk to etcd and to check the API server's certificate.
//
//	kairon-guest certs --pki DIR --node NAME --ip IP [--san HOST]... [--service-ip IP]
//	kairon-guest etcd-member-add --endpoint URL --pki DIR --name NAME --peer-url URL
//	kairon-guest kubelet --pki DIR --address IP [--port 10250]
//
// Nothing here is a stand-in for the cluster's CAs: `certs` signs with the CAs found in DIR,
// which the simulator copied from the VM's cloud-init write_files.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kairon-guest certs|etcd-member-add|kubelet [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "certs":
		err = runCerts(os.Args[2:])
	case "etcd-member-add":
		err = runEtcdMemberAdd(os.Args[2:])
	case "kubelet":
		err = runKubelet(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kairon-guest %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
