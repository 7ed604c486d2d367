package clustertest

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target and can stop moving bytes in either
// direction while keeping every connection open: a silent partition, as a dropped
// route, a changed firewall or a dead NAT entry looks to both ends (no reset, no FIN,
// just silence). A connection closed by one end while its direction is cut reaches the
// other end only when that direction is healed, as a FIN would.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cond     *sync.Cond
	cut      [2]bool // by direction: up (client to server), down (server to client)
	closed   bool
	conns    map[net.Conn]struct{}
	accepted int
	recorded []byte // every byte moved, both ways (what a sniffer on the path sees)
	wg       sync.WaitGroup
}

// Directions of a cut.
const (
	Up   = 0 // client to server: the client cannot publish
	Down = 1 // server to client: the client hears nothing
)

// StartProxy listens on a loopback port and forwards to target (host:port). It is
// closed when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// URL is the proxy's NATS URL.
func (p *Proxy) URL() string { return fmt.Sprintf("nats://%s", p.ln.Addr()) }

// Cut stops moving bytes in the given directions (Up, Down or both).
func (p *Proxy) Cut(dirs ...int) {
	p.mu.Lock()
	for _, d := range dirs {
		p.cut[d] = true
	}
	p.mu.Unlock()
}

// Heal moves bytes again in both directions, those held meanwhile first.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = [2]bool{}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Accepted is how many connections the proxy has taken (reconnects show as more).
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Recorded is every byte the proxy has moved so far, in both directions: what anyone on
// the network path between the two ends reads.
func (p *Proxy) Recorded() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.recorded...)
}

// Close closes the listener and every connection, and waits for the pumps.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.cond.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.accepted++
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(server, client, Up)
		go p.pump(client, server, Down)
	}
}

// open waits while direction dir is cut; false once the proxy is closed.
func (p *Proxy) open(dir int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut[dir] && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

func (p *Proxy) pump(dst, src net.Conn, dir int) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for p.open(dir) {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.open(dir) { // bytes read just before a cut wait for the heal
				break
			}
			p.mu.Lock()
			p.recorded = append(p.recorded, buf[:n]...)
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			if err != io.EOF {
				break
			}
			// An end closed its side: the FIN goes through once the direction is open.
			p.open(dir)
			break
		}
	}
	src.Close()
	dst.Close()
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
}
