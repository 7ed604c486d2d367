package webui

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// The UI's own names. A browser sends the name it was pointed at as the request's Host,
// and a page's Origin is that same name: a page of rebind.evil.example whose name the
// attacker's DNS later points at 127.0.0.1 reaches this port with "Host:
// rebind.evil.example" and is, to the browser, of the same origin as the UI. So the UI
// answers only the names it knows (loopback names, the --http address's host, --ui-host)
// and takes a POST only from a page of one of them. Ports are not compared: a rebinding
// is told apart by its name, and a tunnel or proxy may present the UI on another port.

// hostPolicy is the set of names the UI answers to, besides the loopback names
// (localhost and every loopback address), which it always answers to.
type hostPolicy struct {
	names map[string]bool     // host names, lower case, without a trailing dot
	addrs map[netip.Addr]bool // IP addresses (IPv4-mapped ones unmapped)
}

// newHostPolicy is the policy of the --http address (its host, unless it is a wildcard
// such as 0.0.0.0, which names no host) and of more names (--ui-host).
func newHostPolicy(httpAddr string, more []string) (hostPolicy, error) {
	p := hostPolicy{names: map[string]bool{}, addrs: map[netip.Addr]bool{}}
	if httpAddr != "" {
		if host, _, err := net.SplitHostPort(httpAddr); err == nil && host != "" {
			if a, err := netip.ParseAddr(host); err == nil {
				if !a.IsUnspecified() {
					p.addrs[a.Unmap()] = true
				}
			} else if name, err := hostName(host); err == nil {
				p.names[name] = true
			}
		}
	}
	for _, h := range more {
		a, name, err := parseHost(h)
		if err != nil {
			return hostPolicy{}, err
		}
		if a.IsValid() {
			p.addrs[a] = true
		} else {
			p.names[name] = true
		}
	}
	return p, nil
}

// allows says whether hostport (a Host header, or an Origin's host) names the UI. An
// empty one (an HTTP/1.0 request without Host: no browser) does not.
func (p hostPolicy) allows(hostport string) bool {
	host := strings.ToLower(hostport)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(host, ".")
	if host == "" {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		return a.IsLoopback() || p.addrs[a]
	}
	return host == "localhost" || p.names[host]
}

// ParseHosts checks the names of flowd --ui-host (a comma-separated list; blanks
// between commas are ignored) and returns them normalised: host names in lower case,
// IP addresses in their usual form. A URL, a port, a wildcard or an address no browser
// is sent to (0.0.0.0) is refused with the fix.
func ParseHosts(list string) ([]string, error) {
	var out []string
	for _, h := range strings.Split(list, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		a, name, err := parseHost(h)
		if err != nil {
			return nil, err
		}
		if a.IsValid() {
			name = a.String()
		}
		out = append(out, name)
	}
	return out, nil
}

// parseHost is one --ui-host value: an IP address (IPv6 with or without brackets), or
// a host name.
func parseHost(h string) (netip.Addr, string, error) {
	orig := h
	switch {
	case strings.Contains(h, "://") || strings.Contains(h, "/"):
		return netip.Addr{}, "", fmt.Errorf("%q: give a name, not a URL (flow.example.com)", orig)
	case strings.Contains(h, "*"):
		return netip.Addr{}, "", fmt.Errorf("%q: wildcards are not supported: list each name", orig)
	}
	if strings.HasPrefix(h, "[") {
		if !strings.HasSuffix(h, "]") {
			return netip.Addr{}, "", fmt.Errorf("%q: give the name without a port (the port is not checked)", orig)
		}
		h = h[1 : len(h)-1]
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, "", fmt.Errorf("%q: an address with a zone is no name a browser sends", orig)
		}
		if a.IsUnspecified() {
			return netip.Addr{}, "", fmt.Errorf("%q: a wildcard address is no name a browser is sent to: give the address or name people use", orig)
		}
		return a.Unmap(), "", nil
	}
	if strings.Count(h, ":") == 1 {
		return netip.Addr{}, "", fmt.Errorf("%q: give the name without a port (the port is not checked)", orig)
	}
	name, err := hostName(h)
	if err != nil {
		return netip.Addr{}, "", fmt.Errorf("%q: %w", orig, err)
	}
	return netip.Addr{}, name, nil
}

// hostName checks a DNS name (labels of letters, digits, '-' and '_', which some
// internal names such as Compose services carry) and returns it in lower case without a
// trailing dot.
func hostName(h string) (string, error) {
	name := strings.TrimSuffix(strings.ToLower(h), ".")
	if name == "" || len(name) > 253 {
		return "", fmt.Errorf("is not a host name or an IP address")
	}
	labels := strings.Split(name, ".")
	for _, label := range labels {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("is not a host name or an IP address")
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return "", fmt.Errorf("is not a host name or an IP address")
			}
		}
	}
	// A name whose last label is a number is an IPv4 address to a browser (which
	// sends it as one), or no address at all (999.1.1.1).
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", fmt.Errorf("is not a host name or an IP address")
	}
	return name, nil
}

// ParseProxies checks the addresses of flowd --ui-proxy (comma-separated IP addresses
// or CIDR prefixes such as 10.0.0.0/24): the reverse proxies the operator runs in front
// of the UI.
func ParseProxies(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(v, "["), "]"))
		if err != nil || a.Zone() != "" || a.IsUnspecified() {
			return nil, fmt.Errorf("%q: give the proxy's IP address or a CIDR prefix (10.0.0.5, 10.0.0.0/24): the peer's address is what is compared, not a name", v)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// peerAddr is the address the connection came from.
func peerAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// fromLoopback says whether the connection came from this host.
func fromLoopback(r *http.Request) bool { return peerAddr(r).IsLoopback() }

// fromProxy says whether the connection came from a proxy the operator named.
func (s *Server) fromProxy(r *http.Request) bool {
	a := peerAddr(r)
	if !a.IsValid() {
		return false
	}
	for _, p := range s.cfg.Proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// lastHeaderValue is the last comma-separated value of a header's last line: the one
// the nearest proxy set or appended.
func lastHeaderValue(r *http.Request, name string) string {
	vs := r.Header.Values(name)
	if len(vs) == 0 {
		return ""
	}
	v := vs[len(vs)-1]
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return strings.TrimSpace(v)
}

// overTLS says whether the browser reached the UI over TLS: flowd's own (a TLS
// listener), or a named proxy's that says so with X-Forwarded-Proto. From anyone else
// the header is ignored: a client could claim anything.
func (s *Server) overTLS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	return s.fromProxy(r) && strings.EqualFold(lastHeaderValue(r, "X-Forwarded-Proto"), "https")
}

// clientAddr is the address of the person signing in: the peer's, or behind a named
// proxy the address the proxy appended to X-Forwarded-For (the last one: what came
// before it is the client's own claim).
func (s *Server) clientAddr(r *http.Request) netip.Addr {
	if s.fromProxy(r) {
		if a, err := netip.ParseAddr(lastHeaderValue(r, "X-Forwarded-For")); err == nil {
			return a.Unmap()
		}
	}
	return peerAddr(r)
}

// fromOurPages checks a POST's source: its Origin or, without one, its Referer must
// name the UI (one of the names it answers to, not merely the request's own Host, which
// a rebinding page chooses). A POST with neither is not a browser's (every current
// browser sends Origin with a POST) and is judged by its CSRF token alone.
func (s *Server) fromOurPages(r *http.Request) bool {
	src := r.Header.Get("Origin")
	if src == "" {
		if src = r.Header.Get("Referer"); src == "" {
			return true
		}
	}
	u, err := url.Parse(src)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return false // "null" (a sandboxed or privacy-sensitive context) among them
	}
	if s.hooks.originIsHost {
		return strings.EqualFold(u.Host, r.Host) // as before the host allow-list: the control
	}
	return s.hosts.allows(u.Host)
}

// misdirected answers a request to a name the UI does not answer to.
func misdirected(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusMisdirectedRequest)
	fmt.Fprintf(w, "this flowd's web UI does not answer to the name %q: if that is the name you use for it, give flowd --ui-host NAME (docs/ui.md)\n", r.Host)
}
