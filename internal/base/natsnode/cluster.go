package natsnode

import (
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// StartLocalCluster starts n embedded servers forming one JetStream cluster on
// loopback, each with its own store under dir, and waits until the cluster has a
// meta leader. For tests and local experiments; production clusters are nats-server
// processes (docs/operations.md).
func StartLocalCluster(dir string, n int) ([]*Server, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := 0; i < n; i++ {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	var servers []*Server
	stopAll := func() {
		for _, s := range servers {
			s.Shutdown()
		}
	}
	for i := 0; i < n; i++ {
		s, err := Start(Config{
			DataDir:    filepath.Join(dir, fmt.Sprintf("n%d", i)),
			Listen:     fmt.Sprintf("127.0.0.1:%d", ports[i]),
			ServerName: fmt.Sprintf("n%d", i),
			Cluster:    ClusterConfig{Name: "flow-test", Listen: fmt.Sprintf("127.0.0.1:%d", ports[n+i]), Routes: routes},
		})
		if err != nil {
			stopAll()
			return nil, err
		}
		servers = append(servers, s)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Ready when the meta leader can place replicas on every server: it knows them
		// all with JetStream and current stats (else creating an R3 stream right away
		// fails with "no suitable peers for placement", seen in CI).
		placeable, current := 0, true
		for _, s := range servers {
			if s.srv.JetStreamIsLeader() {
				placeable = len(s.srv.JetStreamClusterPeers())
			}
			current = current && s.srv.JetStreamIsCurrent()
		}
		if placeable == n && current {
			return servers, nil
		}
		if time.Now().After(deadline) {
			stopAll()
			return nil, fmt.Errorf("natsnode: local cluster of %d did not elect a JetStream meta leader in 20s", n)
		}
		time.Sleep(20 * time.Millisecond) // polling the servers' own state, with a deadline
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natsnode: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
