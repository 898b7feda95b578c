//go:build ignore

// Generates the CABPK v1.14.2 user-data fixtures of testbed/kairon-sim/testdata/cabpk with CAPI's
// own cloud-init templates (sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/cloudinit), fed as
// the KubeadmConfig reconciler feeds them. Certificates and keys are fake PEM blocks.
//
// Run from the module pinning the CAPI managers (offline, from the module cache):
//
//	cd testbed/tools/capi && GOFLAGS=-mod=mod GOPROXY=off \
//	  go run ../../kairon-sim/testdata/cabpk/generate.go ../../kairon-sim/testdata/cabpk
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/cloudinit"
	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"
)

// fakePEM is a PEM-shaped block whose body names what it stands for (no real key material).
func fakePEM(kind, name string) []byte {
	body := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("fake "+name+" for capkr tests. ", 4)))
	var b strings.Builder
	fmt.Fprintf(&b, "-----BEGIN %s-----\n", kind)
	for len(body) > 64 {
		b.WriteString(body[:64] + "\n")
		body = body[64:]
	}
	b.WriteString(body + "\n")
	fmt.Fprintf(&b, "-----END %s-----\n", kind)
	return []byte(b.String())
}

func withFakeKeys(c secret.Certificates) secret.Certificates {
	for _, cert := range c {
		name := filepath.Base(cert.CertFile)
		if cert.Purpose == secret.ServiceAccount {
			cert.KeyPair = &certs.KeyPair{Cert: fakePEM("PUBLIC KEY", name), Key: fakePEM("RSA PRIVATE KEY", "sa.key")}
		} else {
			cert.KeyPair = &certs.KeyPair{Cert: fakePEM("CERTIFICATE", name), Key: fakePEM("RSA PRIVATE KEY", filepath.Base(cert.KeyFile))}
		}
	}
	return c
}

const clusterConfiguration = `apiServer:
  certSANs:
  - 10.0.0.100
apiVersion: kubeadm.k8s.io/v1beta4
clusterName: demo
controlPlaneEndpoint: 10.0.0.100:6443
controllerManager: {}
dns: {}
etcd:
  local:
    dataDir: /var/lib/etcd
kind: ClusterConfiguration
kubernetesVersion: v1.36.1
networking:
  dnsDomain: cluster.local
  podSubnet: 192.168.0.0/16
  serviceSubnet: 10.128.0.0/12
scheduler: {}
`

const initConfiguration = `apiVersion: kubeadm.k8s.io/v1beta4
bootstrapTokens:
- groups:
  - system:bootstrappers:kubeadm:default-node-token
  token: abcdef.0123456789abcdef
  ttl: 15m0s
kind: InitConfiguration
localAPIEndpoint: {}
nodeRegistration:
  imagePullPolicy: IfNotPresent
  imagePullSerial: true
  kubeletExtraArgs:
  - name: provider-id
    value: kairon://{{ ds.meta_data.instance_id }}
  name: '{{ ds.meta_data.local_hostname }}'
  taints:
  - effect: NoSchedule
    key: node.cluster.x-k8s.io/uninitialized
timeouts:
  controlPlaneComponentHealthCheck: 4m0s
`

func joinConfiguration(controlPlane bool) string {
	cp := ""
	if controlPlane {
		cp = "controlPlane:\n  localAPIEndpoint: {}\n"
	}
	return `apiVersion: kubeadm.k8s.io/v1beta4
caCertPath: /etc/kubernetes/pki/ca.crt
` + cp + `discovery:
  bootstrapToken:
    apiServerEndpoint: 10.0.0.100:6443
    caCertHashes:
    - sha256:45d9bd5bfac9e1ab5a2b06d21fd0ed9bc8a6a3a1d3d1ec3d0d2f0b5f1d9c2a11
    token: fghijk.0123456789fghijk
kind: JoinConfiguration
nodeRegistration:
  imagePullPolicy: IfNotPresent
  imagePullSerial: true
  kubeletExtraArgs:
  - name: provider-id
    value: kairon://{{ ds.meta_data.instance_id }}
  - name: node-labels
    value: pool=md-0
  name: '{{ ds.meta_data.local_hostname }}'
  taints: null
timeouts:
  tlsBootstrap: 5m0s
`
}

const kubeVip = `apiVersion: v1
kind: Pod
metadata:
  name: kube-vip
  namespace: kube-system
spec:
  containers:
  - args:
    - manager
    env:
    - name: address
      value: 10.0.0.100
    image: ghcr.io/kube-vip/kube-vip:v0.8.0
    name: kube-vip
  hostNetwork: true
`

func gzipBase64(data []byte) string {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	_, _ = w.Write(data)
	_ = w.Close()
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func ptr[T any](v T) *T { return &v }

func main() {
	out := os.Args[1]
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(out, name), data, 0o644); err != nil {
			panic(err)
		}
	}
	verbosity := fmt.Sprintf("--v %d", 5)

	// Control-plane init, as the default flavor's KubeadmControlPlane makes it.
	write("control-plane-init.yaml", must(cloudinit.NewInitControlPlane(&cloudinit.ControlPlaneInput{
		BaseUserData: cloudinit.BaseUserData{
			AdditionalFiles: []bootstrapv1.File{{
				Path: "/etc/kubernetes/manifests/kube-vip.yaml", Owner: "root:root", Content: kubeVip,
			}},
			PreKubeadmCommands: []string{
				"sed -i 's#path: /etc/kubernetes/admin.conf#path: /etc/kubernetes/super-admin.conf#' /etc/kubernetes/manifests/kube-vip.yaml",
			},
			PostKubeadmCommands: []string{
				"sed -i 's#path: /etc/kubernetes/super-admin.conf#path: /etc/kubernetes/admin.conf#' /etc/kubernetes/manifests/kube-vip.yaml",
			},
		},
		Certificates:         withFakeKeys(secret.NewCertificatesForInitialControlPlane(nil)),
		ClusterConfiguration: clusterConfiguration,
		InitConfiguration:    initConfiguration,
	})))

	// Control-plane join.
	write("control-plane-join.yaml", must(cloudinit.NewJoinControlPlane(&cloudinit.ControlPlaneJoinInput{
		BaseUserData: cloudinit.BaseUserData{
			AdditionalFiles: []bootstrapv1.File{{
				Path: "/etc/kubernetes/manifests/kube-vip.yaml", Owner: "root:root", Content: kubeVip,
			}},
		},
		Certificates:      withFakeKeys(secret.NewControlPlaneJoinCerts(nil)),
		JoinConfiguration: joinConfiguration(true),
	})))

	// Worker join, with kubeadm verbosity.
	write("worker-join.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			PreKubeadmCommands:  []string{"echo pre-kubeadm", "systemctl restart containerd"},
			PostKubeadmCommands: []string{"echo post-kubeadm > /run/post.log"},
			KubeadmVerbosity:    verbosity,
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	// Files in each encoding CABPK's API allows but gzip (raw gzip is no YAML text: see
	// worker-gzip-file.yaml), with owners, append and default permissions; a multi-line
	// command (a heredoc).
	binary := []byte{0x7f, 'E', 'L', 'F', 0x02, 0x01, 0x01, 0x00, 0xff, 0xfe, 0x00, 0x10}
	write("worker-files.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			AdditionalFiles: []bootstrapv1.File{
				{Path: "/etc/plain.conf", Permissions: "0600", Content: "plain: text\nsecret: s3cr3t-plain\n"},
				{Path: "/etc/b64.conf", Encoding: bootstrapv1.Base64, Owner: "root:root", Content: base64.StdEncoding.EncodeToString([]byte("decoded: from base64\n"))},
				{Path: "/etc/gz.conf", Encoding: bootstrapv1.GzipBase64, Permissions: "0640", Content: gzipBase64([]byte(strings.Repeat("decoded: from gzip+base64\n", 50)))},
				{Path: "/opt/bin/tool", Encoding: bootstrapv1.GzipBase64, Permissions: "0755", Content: gzipBase64(binary)},
				{Path: "/home/ops/.config/app.yaml", Owner: "ops:ops", Permissions: "0640", Content: "owner: ops\n"},
				{Path: "/var/lib/app/state", Owner: "nobody", Content: "owner: nobody\n"},
				{Path: "/etc/hosts", Append: ptr(true), Content: "10.0.0.100 api.demo.internal\n"},
				{Path: "/etc/motd.d/capkr", Append: ptr(true), Owner: "root:adm", Permissions: "0640", Encoding: bootstrapv1.Base64, Content: base64.StdEncoding.EncodeToString([]byte("appended line\n"))},
				{Path: "/etc/motd.d/capkr", Permissions: "0644", Content: "written after the append\n"},
			},
			PreKubeadmCommands: []string{
				"cat <<'EOF' > /etc/sysctl.d/99-capkr.conf\nnet.ipv4.ip_forward = 1\nEOF",
				"sysctl --system",
			},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	write("worker-gzip-file.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			AdditionalFiles: []bootstrapv1.File{{
				Path: "/etc/raw.gz", Encoding: bootstrapv1.Gzip,
				Content: func() string {
					var buf bytes.Buffer
					w := gzip.NewWriter(&buf)
					_, _ = w.Write([]byte("raw gzip\n"))
					_ = w.Close()
					return buf.String()
				}(),
			}},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	write("worker-ntp.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			NTP: &bootstrapv1.NTP{Enabled: ptr(true), Servers: []string{"0.pool.ntp.org", "1.pool.ntp.org"}},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	write("worker-bootcmd.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			BootCommands: []string{"echo boot > /run/boot.log"},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	write("worker-disk-setup.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			DiskSetup: &bootstrapv1.DiskSetup{
				Partitions: []bootstrapv1.Partition{{
					Device: "/dev/vdb", Layout: ptr(true), Overwrite: ptr(false), TableType: "gpt",
				}},
				Filesystems: []bootstrapv1.Filesystem{{
					Device: "/dev/vdb1", Filesystem: "ext4", Label: "etcd_disk", ExtraOpts: []string{"-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"},
				}},
			},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	write("worker-mounts.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			Mounts: []bootstrapv1.MountPoints{{"LABEL=etcd_disk", "/var/lib/etcd"}},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	// The one user Kairon can create (passwordless sudo, bash, keys) ...
	write("worker-user.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			Users: []bootstrapv1.User{{
				Name: "capk", Sudo: "ALL=(ALL) NOPASSWD:ALL", Shell: "/bin/bash", LockPassword: ptr(true),
				SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForCapkrTests ops@example"},
			}},
		},
		JoinConfiguration: joinConfiguration(false),
	})))

	// ... and users it cannot.
	write("worker-users-unsupported.yaml", must(cloudinit.NewNode(&cloudinit.NodeInput{
		BaseUserData: cloudinit.BaseUserData{
			Users: []bootstrapv1.User{
				{Name: "capk", Sudo: "ALL=(ALL) NOPASSWD:ALL", Shell: "/bin/bash"},
				{Name: "auditor", Groups: "adm, systemd-journal", Passwd: "$6$rounds=4096$fakesalt$fakehash", LockPassword: ptr(false)},
			},
		},
		JoinConfiguration: joinConfiguration(false),
	})))
}
