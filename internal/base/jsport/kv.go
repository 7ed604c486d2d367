package jsport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// defaultTimeout bounds a call whose caller set no deadline.
const defaultTimeout = 5 * time.Second

// KV is a port.KV on a JetStream bucket. A bucket found gone (a NATS server that
// restarted without its memory-stored buckets) is created again from its configuration
// and the call made once more.
type KV struct {
	js  jetstream.JetStream
	cfg jetstream.KeyValueConfig
	log *slog.Logger

	named bool // KVNamed: never created

	mu sync.Mutex
	kv jetstream.KeyValue
}

var _ port.KV = (*KV)(nil)

// OpenKV opens the bucket cfg describes, creating it if it does not exist (never
// updating it: EnsureKV).
func OpenKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, log *slog.Logger) (*KV, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kv, err := EnsureKV(ctx, js, cfg)
	if err != nil {
		return nil, mapErr(err)
	}
	return &KV{js: js, cfg: cfg, log: log, kv: kv}, nil
}

// KVNamed is the existing bucket name, created by someone else: tools and tests that
// read it. It is looked up at its first use and never created.
func KVNamed(js jetstream.JetStream, name string) *KV {
	return &KV{js: js, cfg: jetstream.KeyValueConfig{Bucket: name}, log: slog.New(slog.DiscardHandler), named: true}
}

// Bucket names the bucket.
func (b *KV) Bucket() string { return b.cfg.Bucket }

func (b *KV) bucket() (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv == nil {
		ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
		defer cancel()
		kv, err := b.js.KeyValue(ctx, b.cfg.Bucket)
		if err != nil {
			return nil, err
		}
		b.kv = kv
	}
	return b.kv, nil
}

// again runs fn, and once more on a bucket created anew if fn found the bucket gone.
func again[T any](ctx context.Context, b *KV, fn func(jetstream.KeyValue) (T, error)) (T, error) {
	var v T
	kv, err := b.bucket()
	if err == nil {
		v, err = fn(kv)
	}
	if err == nil || !isGone(err) || b.named {
		return v, err
	}
	kv, oerr := EnsureKV(ctx, b.js, b.cfg)
	if oerr != nil {
		b.log.Warn("a bucket is gone and could not be created again; retrying", "bucket", b.cfg.Bucket, "err", oerr)
		return v, err
	}
	b.log.Warn("a bucket was gone (a NATS server restarted without it); created it again", "bucket", b.cfg.Bucket)
	b.mu.Lock()
	b.kv = kv
	b.mu.Unlock()
	return fn(kv)
}

// call runs fn on the bucket (no second try).
func call[T any](b *KV, fn func(jetstream.KeyValue) (T, error)) (T, error) {
	kv, err := b.bucket()
	if err != nil {
		var zero T
		return zero, err
	}
	return fn(kv)
}

func isGone(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, nats.ErrStreamNotFound) || errors.Is(err, nats.ErrBucketNotFound)
}

// Create implements port.KV.
func (b *KV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := again(ctx, b, func(kv jetstream.KeyValue) (uint64, error) { return kv.Create(ctx, key, value) })
	return rev, mapErr(err)
}

// Update implements port.KV.
func (b *KV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	rev, err := call(b, func(kv jetstream.KeyValue) (uint64, error) { return kv.Update(ctx, key, value, rev) })
	return rev, mapUpdateErr(err)
}

// Put implements port.KV.
func (b *KV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := again(ctx, b, func(kv jetstream.KeyValue) (uint64, error) { return kv.Put(ctx, key, value) })
	return rev, mapErr(err)
}

// Delete implements port.KV.
func (b *KV) Delete(ctx context.Context, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	_, err := call(b, func(kv jetstream.KeyValue) (struct{}, error) { return struct{}{}, kv.Delete(ctx, key, opts...) })
	return mapUpdateErr(err)
}

// Get implements port.KV.
func (b *KV) Get(ctx context.Context, key string) (port.Entry, error) {
	e, err := call(b, func(kv jetstream.KeyValue) (jetstream.KeyValueEntry, error) { return kv.Get(ctx, key) })
	if err != nil {
		return port.Entry{}, mapErr(err)
	}
	return entryOf(e), nil
}

func entryOf(e jetstream.KeyValueEntry) port.Entry {
	op := port.OpPut
	switch e.Operation() {
	case jetstream.KeyValueDelete:
		op = port.OpDelete
	case jetstream.KeyValuePurge:
		op = port.OpPurge
	}
	return port.Entry{Key: e.Key(), Value: e.Value(), Revision: e.Revision(), Op: op, Created: e.Created()}
}

// Latest implements port.KV: a direct read through the bucket stream's leader rather
// than kv.Get, which on a replicated bucket may be answered by any replica with an older
// revision (../shared/FACTS.md). Every decision made before a compare-and-set reads so.
func (b *KV) Latest(ctx context.Context, key string) (port.Entry, error) {
	return b.msgGet(ctx, key, map[string]any{"last_by_subj": "$KV." + b.cfg.Bucket + "." + key})
}

// Revision implements port.KV: a direct read of the bucket stream's message rev through
// its leader; ErrKeyNotFound when it is gone (the bucket keeps History revisions a key)
// or is another key's.
func (b *KV) Revision(ctx context.Context, key string, rev uint64) (port.Entry, error) {
	return b.msgGet(ctx, key, map[string]any{"seq": rev})
}

// msgGet reads one message of the bucket's stream through its leader, asked by req, as
// key's entry.
func (b *KV) msgGet(ctx context.Context, key string, ask map[string]any) (port.Entry, error) {
	req, _ := json.Marshal(ask)
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	resp, err := b.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+b.cfg.Bucket, req)
	if err != nil {
		return port.Entry{}, fmt.Errorf("jsport: read %s/%s: %w", b.cfg.Bucket, key, err)
	}
	var r struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *struct {
			Code    int    `json:"code"`
			ErrCode int    `json:"err_code"`
			Desc    string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return port.Entry{}, fmt.Errorf("jsport: read %s/%s: %w", b.cfg.Bucket, key, err)
	}
	if r.Error != nil {
		if r.Error.Code == 404 {
			return port.Entry{}, port.Wrap(port.ErrKeyNotFound, fmt.Errorf("jsport: read %s/%s: %s", b.cfg.Bucket, key, r.Error.Desc))
		}
		return port.Entry{}, fmt.Errorf("jsport: read %s/%s: %s (code %d)", b.cfg.Bucket, key, r.Error.Desc, r.Error.ErrCode)
	}
	if r.Message == nil {
		return port.Entry{}, fmt.Errorf("jsport: read %s/%s: empty answer", b.cfg.Bucket, key)
	}
	if r.Message.Subject != "$KV."+b.cfg.Bucket+"."+key {
		return port.Entry{}, port.Wrap(port.ErrKeyNotFound, fmt.Errorf("jsport: read %s/%s: revision %d is another key's", b.cfg.Bucket, key, r.Message.Seq))
	}
	e := port.Entry{Key: key, Value: r.Message.Data, Revision: r.Message.Seq, Created: r.Message.Time}
	if len(r.Message.Hdrs) > 0 {
		if h, err := nats.DecodeHeadersMsg(r.Message.Hdrs); err == nil {
			switch {
			case h.Get(jetstream.MarkerReasonHeader) != "", h.Get("KV-Operation") == "PURGE":
				e.Op = port.OpPurge
			case h.Get("KV-Operation") != "":
				e.Op = port.OpDelete
			}
		}
	}
	return e, nil
}

// Keys implements port.KV.
func (b *KV) Keys(ctx context.Context) ([]string, error) {
	keys, err := call(b, func(kv jetstream.KeyValue) (jetstream.KeyLister, error) { return kv.ListKeys(ctx) })
	if err != nil {
		return nil, mapErr(err)
	}
	var out []string
	for k := range keys.Keys() {
		out = append(out, k)
	}
	return out, nil
}

// LastRevision implements port.KV.
func (b *KV) LastRevision(ctx context.Context) (uint64, error) {
	st, err := call(b, func(kv jetstream.KeyValue) (jetstream.KeyValueStatus, error) { return kv.Status(ctx) })
	if err != nil {
		return 0, mapErr(err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, fmt.Errorf("jsport: status of %s: unexpected type %T", b.cfg.Bucket, st)
	}
	return bs.StreamInfo().State.LastSeq, nil
}

// Watch implements port.KV.
func (b *KV) Watch(ctx context.Context, key string) (port.Watcher, error) {
	w, err := again(ctx, b, func(kv jetstream.KeyValue) (jetstream.KeyWatcher, error) {
		if key == "" {
			return kv.WatchAll(ctx)
		}
		return kv.Watch(ctx, key)
	})
	if err != nil {
		return nil, mapErr(err)
	}
	out := &watcher{w: w, updates: make(chan *port.Entry), done: make(chan struct{}), ended: make(chan struct{})}
	go out.run(ctx)
	return out, nil
}

// watcher turns JetStream's entries into the port's. Its goroutine ends with the
// watch (Stop, or ctx).
type watcher struct {
	w       jetstream.KeyWatcher
	updates chan *port.Entry
	done    chan struct{} // closed by Stop
	ended   chan struct{} // closed when run returns
	stop    sync.Once
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.ended)
	defer close(w.updates)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.done:
			return
		case e, ok := <-w.w.Updates():
			if !ok {
				return
			}
			var pe *port.Entry
			if e != nil {
				x := entryOf(e)
				pe = &x
			}
			select {
			case w.updates <- pe:
			case <-ctx.Done():
				return
			case <-w.done:
				return
			}
		}
	}
}

func (w *watcher) Updates() <-chan *port.Entry { return w.updates }

// Stop ends the watch and waits for its goroutine.
func (w *watcher) Stop() error {
	w.stop.Do(func() { close(w.done) })
	err := w.w.Stop()
	<-w.ended
	return err
}
