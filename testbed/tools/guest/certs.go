package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// runCerts writes the certificates `kubeadm init phase certs` would create on a
// control-plane node, signed by the CAs already in the pki dir (ca, etcd/ca, front-proxy-ca).
func runCerts(args []string) error {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	pki := fs.String("pki", "", "pki dir holding ca.{crt,key}, etcd/ca.{crt,key}, front-proxy-ca.{crt,key}")
	node := fs.String("node", "", "node name")
	ip := fs.String("ip", "", "node address")
	serviceIP := fs.String("service-ip", "10.96.0.1", "first address of the service CIDR (the kubernetes Service)")
	var sans stringList
	fs.Var(&sans, "san", "extra API server SAN (host or IP; repeatable), e.g. the control-plane endpoint")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pki == "" || *node == "" || *ip == "" {
		return errors.New("--pki, --node and --ip are required")
	}
	nodeIP := net.ParseIP(*ip)
	if nodeIP == nil {
		return fmt.Errorf("--ip %q is not an IP address", *ip)
	}
	ca, err := loadCA(*pki, "ca")
	if err != nil {
		return err
	}
	etcdCA, err := loadCA(*pki, "etcd/ca")
	if err != nil {
		return err
	}
	frontProxyCA, err := loadCA(*pki, "front-proxy-ca")
	if err != nil {
		return err
	}
	local := []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}

	apiDNS := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", *node, "localhost"}
	apiIPs := []net.IP{nodeIP, net.ParseIP("127.0.0.1")}
	if s := net.ParseIP(*serviceIP); s != nil {
		apiIPs = append(apiIPs, s)
	}
	for _, s := range sans {
		if p := net.ParseIP(s); p != nil {
			apiIPs = append(apiIPs, p)
		} else {
			apiDNS = append(apiDNS, s)
		}
	}
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	certs := []struct {
		name string
		ca   *authority
		subj pkix.Name
		dns  []string
		ips  []net.IP
		use  []x509.ExtKeyUsage
	}{
		// kubeadm's certificate list (cmd/kubeadm/app/phases/certs/certlist.go).
		{"apiserver", ca, pkix.Name{CommonName: "kube-apiserver"}, apiDNS, apiIPs, server},
		{"apiserver-kubelet-client", ca, pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"kubeadm:cluster-admins"}}, nil, nil, client},
		{"front-proxy-client", frontProxyCA, pkix.Name{CommonName: "front-proxy-client"}, nil, nil, client},
		{"etcd/server", etcdCA, pkix.Name{CommonName: *node}, []string{*node, "localhost"}, append([]net.IP{nodeIP}, local...), both},
		{"etcd/peer", etcdCA, pkix.Name{CommonName: *node}, []string{*node, "localhost"}, append([]net.IP{nodeIP}, local...), both},
		{"etcd/healthcheck-client", etcdCA, pkix.Name{CommonName: "kube-etcd-healthcheck-client"}, nil, nil, client},
		{"apiserver-etcd-client", etcdCA, pkix.Name{CommonName: "kube-apiserver-etcd-client"}, nil, nil, client},
		// kubelet's own serving certificate (kubelet self-signs one when it has none; signing
		// it with the cluster CA lets a client verify it).
		{"kubelet", ca, pkix.Name{CommonName: *node}, []string{*node}, []net.IP{nodeIP}, server},
		// kubeadm's admin.conf identity, for what the guest writes as kubeadm would.
		{"admin", ca, pkix.Name{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}}, nil, nil, client},
		// The identities of kubeadm's controller-manager.conf and scheduler.conf
		// (cmd/kubeadm/app/phases/kubeconfig), which the guest's kube-controller-manager and
		// kube-scheduler use.
		{"controller-manager", ca, pkix.Name{CommonName: "system:kube-controller-manager"}, nil, nil, client},
		{"scheduler", ca, pkix.Name{CommonName: "system:kube-scheduler"}, nil, nil, client},
	}
	for _, c := range certs {
		if err := c.ca.issue(filepath.Join(*pki, c.name), c.subj, c.dns, c.ips, c.use); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func loadCA(pki, base string) (*authority, error) {
	certPEM, err := os.ReadFile(filepath.Join(pki, base+".crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(pki, base+".key"))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil, fmt.Errorf("%s.crt: no PEM block", base)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s.crt: %w", base, err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s.key: %w", base, err)
	}
	return &authority{cert: cert, key: key}, nil
}

// parseKey reads the PKCS#1 RSA keys Cluster API generates, and PKCS#8 / SEC1 EC keys.
func parseKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, errors.New("not a PKCS#1, SEC1 or PKCS#8 private key")
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("unsupported key type")
	}
	return signer, nil
}

func (a *authority) issue(base string, subj pkix.Name, dns []string, ips []net.IP, use []x509.ExtKeyUsage) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subj,
		DNSNames:     dns,
		IPAddresses:  ips,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  use,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(base), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(base+".key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(base+".crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}
