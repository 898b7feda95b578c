package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/cri-streaming/pkg/streaming/portforward"
)

// Timeouts kubelet uses for streaming connections (pkg/kubelet/server).
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

// runKubelet serves kubelet's port-forward API on the node address: the API server's
// `pods/<name>/portforward` comes here (SPDY, or websocket), and each requested port is
// forwarded to that port on the node's own address, where the static pods (hostNetwork)
// listen: etcd on 2379, kube-apiserver on 6443.
func runKubelet(args []string) error {
	fs := flag.NewFlagSet("kubelet", flag.ContinueOnError)
	pki := fs.String("pki", "", "pki dir holding kubelet.{crt,key} and ca.crt")
	address := fs.String("address", "", "node address to listen on and forward to")
	port := fs.Int("port", 10250, "kubelet port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pki == "" || *address == "" {
		return errors.New("--pki and --address are required")
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(*pki, "kubelet.crt"), filepath.Join(*pki, "kubelet.key"))
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(filepath.Join(*pki, "ca.crt"))
	if err != nil {
		return err
	}
	clientCAs := x509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM(caPEM) {
		return errors.New("ca.crt holds no certificate")
	}
	fwd := &forwarder{host: *address}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	// kubelet's routes: /portForward/{namespace}/{pod} and .../{uid}.
	mux.HandleFunc("/portForward/", func(w http.ResponseWriter, req *http.Request) {
		parts := strings.Split(strings.Trim(strings.TrimPrefix(req.URL.Path, "/portForward/"), "/"), "/")
		if len(parts) < 2 {
			http.Error(w, "want /portForward/{namespace}/{pod}[/{uid}]", http.StatusBadRequest)
			return
		}
		uid := ""
		if len(parts) > 2 {
			uid = parts[2]
		}
		opts, err := portforward.NewV4Options(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		portforward.ServePortForward(w, req, fwd, parts[1], uid, opts, streamIdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
	})
	server := &http.Server{
		Addr:    net.JoinHostPort(*address, strconv.Itoa(*port)),
		Handler: mux,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			// As kubelet with --client-ca-file: the API server presents its kubelet client
			// certificate, signed by the cluster CA.
			ClientCAs:  clientCAs,
			ClientAuth: tls.VerifyClientCertIfGiven,
			MinVersion: tls.VersionTLS12,
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	ln, err := net.Listen("tcp", server.Addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kubelet port-forward endpoint on https://%s\n", server.Addr)
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	if err := server.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type forwarder struct{ host string }

// PortForward copies between the stream and the port on the node address, as kubelet does
// into the pod's network namespace (the static pods share the host's).
func (f *forwarder) PortForward(ctx context.Context, pod string, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(f.host, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("pod %s port %d: %w", pod, port, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}
