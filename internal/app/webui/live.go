package webui

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/flowrun/flow/client"
)

// The live streams' bounds: before them one viewer opened 3,000 streams and
// every other user's runs took 10 times as long. A stream lasts as long as its run, so,
// like the API's run.wait, what one user and the node hold at once is bounded; one more
// is refused at once with 429, and the page polls instead (ui.js).
//
// 16, not the API's 64 waits: a stream is one open page of a running run, and a browser
// holds at most 6 connections to a host over HTTP/1.1 (flowd's --http), so 16 covers a
// person with pages open in several browsers or behind an HTTP/2 proxy, while the API's
// waits are for scripts that wait on many runs in parallel. A refused page still works
// (it reloads its main part every pollAfterRefusal), so a low cap costs little.
const (
	streamsPerUser = 16   // live streams one signed-in user holds on a node
	streamsPerNode = 1024 // live streams a node holds, whoever holds them (the API's run.wait bound)
)

// liveStreams counts the live streams held, by user and in all, and keeps one watcher
// per run that has any (runWatch): a change is read once per run, not once per stream.
type liveStreams struct {
	perUser, node int // the bounds (0: none, the negative control of the tests)

	mu    sync.Mutex
	held  map[string]int // by user name ("" is not counted: no identity to count by)
	total int
	runs  map[string]*runWatch
}

func newLiveStreams(perUser, node int) *liveStreams {
	return &liveStreams{perUser: perUser, node: node, held: map[string]int{}, runs: map[string]*runWatch{}}
}

// take counts one more stream of user, unless the user or the node holds its bound
// already: then it says why, for the 429's body.
func (l *liveStreams) take(user string) (ok bool, refusal string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.node > 0 && l.total >= l.node {
		return false, fmt.Sprintf("too many live streams: this node serves %d, the most it serves at once; the page reloads itself instead (docs/ui.md, \"Live updates\")", l.node)
	}
	if user != "" && l.perUser > 0 && l.held[user] >= l.perUser {
		return false, fmt.Sprintf("too many live streams: %s holds %d on this node, the most one user may hold; close a page of a running run, or let this one reload itself instead (docs/ui.md, \"Live updates\")", user, l.perUser)
	}
	l.total++
	if user != "" {
		l.held[user]++
	}
	return true, ""
}

// give back a stream of user that take counted.
func (l *liveStreams) give(user string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if user != "" {
		if l.held[user]--; l.held[user] <= 0 {
			delete(l.held, user)
		}
	}
}

// counts are the streams held in all and by user (tests).
func (l *liveStreams) counts(user string) (total, ofUser, watchers int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.held[user], len(l.runs)
}

// runWatch is the one reader of a run for every live stream of it: it wakes when the
// node applies more of the log, reads the run from the node's state (no round trip to
// the log: what woke it is what was applied) and tells its streams only if the run
// changed.
type runWatch struct {
	id   string
	refs int           // streams following it (under liveStreams.mu)
	stop chan struct{} // closed when the last one leaves

	mu      sync.Mutex
	state   runState
	updated chan struct{} // closed when state changes, then replaced
}

// runState is what a stream tells of a run: its fingerprint and status, whether it
// ended, or why it cannot be read.
type runState struct {
	fp, status string
	terminal   bool
	err        error
}

func stateOf(run client.Run, err error) runState {
	if err != nil {
		return runState{err: err}
	}
	return runState{fp: fingerprint(run), status: run.Status, terminal: run.Terminal()}
}

func (a runState) same(b runState) bool {
	if a.err != nil || b.err != nil {
		return a.err != nil && b.err != nil && a.err.Error() == b.err.Error()
	}
	return a.fp == b.fp
}

// join follows run id's watcher, starting it for the run's first stream.
func (s *Server) join(id string) *runWatch {
	l := s.live
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.runs[id]
	if w == nil {
		w = &runWatch{id: id, stop: make(chan struct{}), updated: make(chan struct{})}
		l.runs[id] = w
		s.wg.Add(1)
		go s.watch(w)
	}
	w.refs++
	return w
}

// leave stops following w; the last stream to leave stops it.
func (s *Server) leave(w *runWatch) {
	l := s.live
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.refs--; w.refs == 0 {
		delete(l.runs, w.id)
		close(w.stop)
	}
}

// watchSpacing is the least time between two reads of a watched run: a node applies
// the log of every run, and a read of one costs tens of microseconds (more for a big
// foreach), so each watched run is read at most this often, however busy the log is.
// Entries applied in between are all seen by the next read; a page learns of a change
// at most this late.
const watchSpacing = 250 * time.Millisecond

// watch reads w's run after the node applies more of the log (at most once a
// watchSpacing), until its last stream leaves or the server closes.
func (s *Server) watch(w *runWatch) {
	defer s.wg.Done()
	var spacing *time.Timer
	defer func() {
		if spacing != nil {
			spacing.Stop()
		}
	}()
	for {
		changed := s.cfg.Backend.Changed()
		w.set(stateOf(s.cfg.Backend.AppliedRun(w.id)))
		read := time.Now()
		select {
		case <-changed:
		case <-w.stop:
			return
		case <-s.ctx.Done():
			return
		}
		if d := watchSpacing - time.Since(read); d > 0 {
			if spacing == nil {
				spacing = time.NewTimer(d)
			} else {
				spacing.Reset(d)
			}
			select {
			case <-spacing.C:
			case <-w.stop:
				return
			case <-s.ctx.Done():
				return
			}
		}
	}
}

func (w *runWatch) set(st runState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st.same(w.state) {
		return
	}
	w.state = st
	close(w.updated)
	w.updated = make(chan struct{})
}

// current is the run's state as last read, and a channel closed when it changes.
func (w *runWatch) current() (runState, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state, w.updated
}

// runEvents is a run page's live stream: an event each time the log moved the run,
// until the run ends, the browser leaves or the server closes. Its run's watcher reads
// the run once for all the run's streams each time the node applies more of the log (no
// polling); the stream itself reads it once, caught up with the log as the page was.
// One more stream than the user's or the node's bound (liveStreams) gets 429 at once.
func (s *Server) runEvents(w http.ResponseWriter, r *http.Request, se *session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	ok, refusal := s.live.take(se.user)
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(pollAfterRefusal/time.Second)))
		http.Error(w, refusal, http.StatusTooManyRequests)
		return
	}
	defer s.live.give(se.user)
	// The server's write timeout is for answers that end (flowd's: docs/ui.md): counted
	// from the request, it would cut the stream. Each write of the stream gets a deadline
	// of its own instead. (The read timeout does not reach a stream: net/http lifts the
	// read deadline once the request is read, to notice the browser leaving.)
	rc := http.NewResponseController(w)
	writeDeadline := func() {}
	if !s.hooks.noStreamDeadline {
		// http.ErrNotSupported where there is no connection (a recorder): nothing to extend.
		writeDeadline = func() { _ = rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)) }
	}
	id := r.PathValue("id")
	s.wg.Add(1)
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() { // the server's Close ends the stream too
		select {
		case <-s.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	writeDeadline()
	w.WriteHeader(http.StatusOK)
	fl.Flush()

	// Follow the watcher before the first read, so that no change after it is missed.
	var watch *runWatch
	var changed <-chan struct{}
	if s.hooks.perStreamReads {
		changed = s.cfg.Backend.Changed()
	} else {
		watch = s.join(id)
		defer s.leave(watch)
		_, changed = watch.current()
	}
	read := func() runState { return stateOf(do[client.Run](ctx, s.cfg.Backend, "run.get", client.Request{ID: id})) }
	st := read()
	last := runState{fp: r.URL.Query().Get("seen")} // the state the page showed
	keepAlive := time.NewTicker(20 * time.Second)
	defer keepAlive.Stop()
	for {
		writeDeadline()
		if st.err != nil {
			fmt.Fprintf(w, "event: end\ndata: %s\n\n", strconv.Quote(st.err.Error()))
			fl.Flush()
			return
		}
		if !st.same(last) {
			fmt.Fprintf(w, "event: change\ndata: %s\n\n", st.status)
			fl.Flush()
			last = st
		}
		if st.terminal {
			fmt.Fprintf(w, "event: end\ndata: %s\n\n", st.status)
			fl.Flush()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
			if watch != nil {
				st, changed = watch.current()
			} else { // as before the shared watcher: each stream reads the run, caught up, at each change
				changed = s.cfg.Backend.Changed()
				st = read()
			}
		case <-keepAlive.C:
			writeDeadline()
			fmt.Fprint(w, ": still here\n\n")
			fl.Flush()
		}
	}
}

// pollAfterRefusal is how long a page whose stream was refused waits before it reloads
// its main part and tries a stream again (ui.js's poll, the 429's Retry-After).
const pollAfterRefusal = 5 * time.Second
