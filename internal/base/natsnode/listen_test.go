package natsnode

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A client port that is taken fails the start at once, naming the address, instead of
// waiting out the 10 s of readiness (issue 38); nothing is left running.
func TestPortInUseFailsFast(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	start := time.Now()
	srv, err := Start(Config{DataDir: t.TempDir(), Listen: addr})
	took := time.Since(start)
	if err == nil {
		srv.Shutdown()
		t.Fatalf("started on %s, which is taken", addr)
	}
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	var le *ListenError
	if !errors.As(err, &le) || le.Addr != addr || !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), port) {
		t.Fatalf("err = %v; want a *ListenError for %s that is EADDRINUSE and names the port", err, addr)
	}
	if took > 5*time.Second {
		t.Fatalf("the start took %s to fail; want well under the 10 s of readiness", took)
	}
}

// The same for the cluster's route port.
func TestRoutePortInUseFailsFast(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	start := time.Now()
	srv, err := Start(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Cluster: ClusterConfig{Listen: addr, Routes: []string{"nats://127.0.0.1:1"}}})
	if err == nil {
		srv.Shutdown()
		t.Fatalf("started with routes on %s, which is taken", addr)
	}
	var le *ListenError
	if !errors.As(err, &le) || le.Addr != addr || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err = %v; want a *ListenError for %s", err, addr)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the start took %s to fail", took)
	}
}
