package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"

	ctrl "sigs.k8s.io/controller-runtime"
)

// serveTunnels is the HTTP proxy CAPI core is started with: a CONNECT to serviceHost (the
// Service's host and port, as CAPI's runtime client builds the URL) becomes a TCP tunnel to
// the extension's TLS listener at target, so TLS, with the Service's name as server name, is
// end to end. Any other request is refused. Go never proxies loopback addresses, so CAPI's
// calls to the API servers do not come here.
func serveTunnels(ctx context.Context, l net.Listener, serviceHost, target string) {
	log := ctrl.Log.WithName("proxy")
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error(err, "accepting a proxy connection")
			}
			return
		}
		go func() {
			if err := tunnel(conn, serviceHost, target); err != nil {
				log.Error(err, "proxying", "client", conn.RemoteAddr().String())
			}
		}()
	}
}

func tunnel(conn net.Conn, serviceHost, target string) error {
	defer conn.Close()
	in := bufio.NewReader(conn)
	req, err := http.ReadRequest(in)
	if err != nil {
		return err
	}
	if req.Method != http.MethodConnect || req.Host != serviceHost {
		_, err := io.WriteString(conn, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
		return err
	}
	upstream, err := net.Dial("tcp", target)
	if err != nil {
		_, _ = io.WriteString(conn, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return err
	}
	defer upstream.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return err
	}
	// Either direction ending ends the tunnel: the deferred Closes tear down both sides.
	ended := make(chan struct{}, 2)
	go func() {
		// Bytes the client sent after its CONNECT may already sit in the reader's buffer.
		_, _ = io.Copy(upstream, in)
		ended <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, upstream)
		ended <- struct{}{}
	}()
	<-ended
	return nil
}
