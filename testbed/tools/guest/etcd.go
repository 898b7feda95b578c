package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// runEtcdMemberAdd adds this node to the cluster's etcd as `kubeadm join --control-plane`
// does, and prints the --initial-cluster value the new member must start with. Adding a
// peer URL that is already a member (a retry) is not an error.
func runEtcdMemberAdd(args []string) error {
	fs := flag.NewFlagSet("etcd-member-add", flag.ContinueOnError)
	var endpoints stringList
	fs.Var(&endpoints, "endpoint", "client URL of a live member (repeatable)")
	pki := fs.String("pki", "", "pki dir holding etcd/ca.crt and apiserver-etcd-client.{crt,key}")
	name := fs.String("name", "", "the new member's name (the node name)")
	peerURL := fs.String("peer-url", "", "the new member's peer URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(endpoints) == 0 || *pki == "" || *name == "" || *peerURL == "" {
		return errors.New("--endpoint, --pki, --name and --peer-url are required")
	}
	tlsConfig, err := etcdClientTLS(*pki)
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		TLS:         tlsConfig,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	list, err := cli.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("listing members: %w", err)
	}
	already := false
	for _, m := range list.Members {
		for _, u := range m.PeerURLs {
			if u == *peerURL {
				already = true
			}
		}
	}
	if !already {
		resp, err := cli.MemberAdd(ctx, []string{*peerURL})
		if err != nil {
			return fmt.Errorf("adding member: %w", err)
		}
		list.Members = resp.Members
	}
	var initial []string
	for _, m := range list.Members {
		memberName := m.Name
		for _, u := range m.PeerURLs {
			if u == *peerURL {
				memberName = *name
			}
		}
		if memberName == "" {
			continue // another member added but not started yet; etcd does not need it here
		}
		for _, u := range m.PeerURLs {
			initial = append(initial, memberName+"="+u)
		}
	}
	sort.Strings(initial)
	fmt.Println(strings.Join(initial, ","))
	return nil
}

func etcdClientTLS(pki string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(filepath.Join(pki, "etcd", "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("etcd/ca.crt holds no certificate")
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "apiserver-etcd-client.crt"), filepath.Join(pki, "apiserver-etcd-client.key"))
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
