package daemon

import (
	"net/http"
	"time"
)

// httpLimits bound what one client may hold of the HTTP server (docs/operations.md).
// Without them a client sending a body a byte at a time held a connection and a
// goroutine for as long as it liked.
type httpLimits struct {
	readHeader time.Duration // the request line and headers
	read       time.Duration // the whole request, body included (forms are at most 64 KiB)
	write      time.Duration // from the end of the headers to the end of the answer; the UI's live streams set their own per write
	idle       time.Duration // a kept-alive connection between requests
	maxHeader  int           // bytes of request line and headers
}

// defaultHTTPLimits are flowd's. The write timeout, counted from the end of the headers,
// leaves room for the body (the read timeout) and a sign-in's wait for its turn at the
// password check (at most 5 s) with the check itself.
var defaultHTTPLimits = httpLimits{
	readHeader: 5 * time.Second,
	read:       30 * time.Second,
	write:      60 * time.Second,
	idle:       2 * time.Minute,
	maxHeader:  64 << 10,
}

// newHTTPServer is flowd's HTTP server of h.
func newHTTPServer(h http.Handler, l httpLimits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.readHeader,
		ReadTimeout:       l.read,
		WriteTimeout:      l.write,
		IdleTimeout:       l.idle,
		MaxHeaderBytes:    l.maxHeader,
	}
}
