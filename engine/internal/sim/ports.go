package sim

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// The ports: package port's interfaces over the calls of network.go, each answered by
// the simulated server (server.go).

func (p nodePorts) ports() port.Ports {
	srv := p.n.s.srv
	return port.Ports{
		Log:       logPort{p},
		Leader:    kvPort{p, srv.kv[port.LeaderBucket]},
		Leases:    kvPort{p, srv.kv[port.LeaseBucket]},
		Tasks:     queuePort{p},
		Nodes:     kvPort{p, srv.kv[port.NodesBucket]},
		Cluster:   kvPort{p, srv.kv[port.ClusterBucket]},
		Rates:     kvPort{p, srv.kv[port.RatesBucket]},
		DLQ:       dlqPort{p},
		Snapshots: objectsPort{p},
		Terms:     termsPort{p},
	}
}

// kvPort is a bucket.
type kvPort struct {
	p nodePorts
	b *bucket
}

func (k kvPort) Bucket() string { return k.b.name }

func uint64Of(v any, err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	return v.(uint64), nil
}

func (k kvPort) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	return uint64Of(k.p.do(ctx, "kv.create "+k.b.name+" "+key, value, func() (any, error) { return k.b.create(key, value) }))
}

func (k kvPort) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return uint64Of(k.p.do(ctx, "kv.update "+k.b.name+" "+key+" "+strconv.FormatUint(rev, 10), value, func() (any, error) { return k.b.update(key, value, rev) }))
}

func (k kvPort) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	return uint64Of(k.p.do(ctx, "kv.put "+k.b.name+" "+key, value, func() (any, error) { return k.b.put(key, value) }))
}

func (k kvPort) Delete(ctx context.Context, key string, rev uint64) error {
	_, err := k.p.do(ctx, "kv.delete "+k.b.name+" "+key+" "+strconv.FormatUint(rev, 10), nil, func() (any, error) { return nil, k.b.del(key, rev) })
	return err
}

func entryOf(v any, err error) (port.Entry, error) {
	if err != nil {
		return port.Entry{}, err
	}
	return v.(port.Entry), nil
}

func (k kvPort) Get(ctx context.Context, key string) (port.Entry, error) {
	return entryOf(k.p.do(ctx, "kv.get "+k.b.name+" "+key, nil, func() (any, error) { return k.b.get(key) }))
}

func (k kvPort) Latest(ctx context.Context, key string) (port.Entry, error) {
	return entryOf(k.p.do(ctx, "kv.latest "+k.b.name+" "+key, nil, func() (any, error) { return k.b.latest(key) }))
}

func (k kvPort) Revision(ctx context.Context, key string, rev uint64) (port.Entry, error) {
	return entryOf(k.p.do(ctx, "kv.revision "+k.b.name+" "+key+" "+strconv.FormatUint(rev, 10), nil, func() (any, error) { return k.b.revision(key, rev) }))
}

func (k kvPort) Keys(ctx context.Context) ([]string, error) {
	v, err := k.p.do(ctx, "kv.keys "+k.b.name, nil, func() (any, error) { return k.b.keyList(), nil })
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}

func (k kvPort) LastRevision(ctx context.Context) (uint64, error) {
	return uint64Of(k.p.do(ctx, "kv.last "+k.b.name, nil, func() (any, error) { return k.b.rev, nil }))
}

// watchWait is how long a watch's poll waits on the server for a change.
const watchWait = 2 * time.Second

// Watch is a goroutine of the port's, as nats.go's watcher is: it reads the initial
// values, then polls for the changes after the last revision it delivered (a poll whose
// answer was lost is made again from there: nothing is skipped).
func (k kvPort) Watch(ctx context.Context, key string) (port.Watcher, error) {
	type init struct {
		entries []port.Entry
		last    uint64
	}
	v, err := k.p.do(ctx, "kv.watch "+k.b.name+" "+key, nil, func() (any, error) {
		es, last := k.b.initial(key)
		return init{es, last}, nil
	})
	if err != nil {
		return nil, err
	}
	first := v.(init)
	w := &watcher{updates: make(chan *port.Entry), ended: make(chan struct{})}
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	go func() {
		defer close(w.ended)
		defer close(w.updates)
		push := func(e *port.Entry) bool {
			select {
			case w.updates <- e:
				return true
			case <-wctx.Done():
				return false
			}
		}
		for i := range first.entries {
			if !push(&first.entries[i]) {
				return
			}
		}
		if !push(nil) {
			return
		}
		from := first.last
		for wctx.Err() == nil {
			c := k.p.start("kv.watchpoll "+k.b.name+" "+key+" "+strconv.FormatUint(from, 10), nil, watchWait+2*time.Second, func(answer func(any, error)) {
				k.b.watch(key, from, watchWait, func(es []port.Entry, last uint64) { answer(init{es, last}, nil) })
			})
			v, err := c.wait(wctx)
			if err != nil {
				if errors.Is(err, errDead) {
					return
				}
				continue // no answer: ask again from where it was
			}
			got := v.(init)
			for i := range got.entries {
				if got.entries[i].Revision <= from {
					continue
				}
				if !push(&got.entries[i]) {
					return
				}
				from = got.entries[i].Revision
			}
		}
	}()
	return w, nil
}

type watcher struct {
	updates chan *port.Entry
	ended   chan struct{}
	cancel  context.CancelFunc
	once    sync.Once
}

func (w *watcher) Updates() <-chan *port.Entry { return w.updates }

func (w *watcher) Stop() error {
	w.once.Do(w.cancel)
	<-w.ended
	return nil
}

// logPort is the log stream.
type logPort struct{ p nodePorts }

func (l logPort) Name() string    { return port.LogStream }
func (l logPort) MaxPayload() int { return 8 << 20 }

func (l logPort) Publish(ctx context.Context, msgID string, data []byte) (uint64, error) {
	n := l.p.n
	return uint64Of(l.p.do(ctx, "log.publish "+msgID, data, func() (any, error) { return n.s.srv.publish(n.name, msgID, data), nil }))
}

func (l logPort) Info(ctx context.Context) (port.StreamInfo, error) {
	v, err := l.p.do(ctx, "log.info", nil, func() (any, error) { return l.p.n.s.srv.logInfo(), nil })
	if err != nil {
		return port.StreamInfo{}, err
	}
	return v.(port.StreamInfo), nil
}

func (l logPort) NextSeq(ctx context.Context, seq uint64) (uint64, bool, error) {
	type next struct {
		seq uint64
		ok  bool
	}
	v, err := l.p.do(ctx, "log.next "+strconv.FormatUint(seq, 10), nil, func() (any, error) {
		s, ok := l.p.n.s.srv.nextMsg(seq)
		return next{s, ok}, nil
	})
	if err != nil {
		return 0, false, err
	}
	n := v.(next)
	return n.seq, n.ok, nil
}

func (l logPort) Purge(ctx context.Context, keep uint64) error {
	_, err := l.p.do(ctx, "log.purge "+strconv.FormatUint(keep, 10), nil, func() (any, error) {
		l.p.n.s.srv.purgeLog(keep)
		return nil, nil
	})
	return err
}

// Consume reads the log by long polls, as the ordered consumer's pulls do, one message a
// pull: a node's applier then applies one message per delivery, so that what it woke
// (its Changed waiters) never runs beside its next apply; Next waits for a message as
// long as its context lets it.
func (l logPort) Consume(ctx context.Context, from uint64) (port.Messages, error) {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &messages{p: l.p, next: max(from, 1), ctx: mctx, cancel: cancel}, nil
}

// pullWait is how long a pull waits on the server for messages (PullExpiry).
const pullWait = 5 * time.Second

type messages struct {
	p      nodePorts
	next   uint64
	buf    []port.Message
	ctx    context.Context // ended by Stop
	cancel context.CancelFunc
}

func (m *messages) Next(ctx context.Context) (port.Message, error) {
	for {
		if len(m.buf) > 0 {
			msg := m.buf[0]
			m.buf = m.buf[1:]
			m.next = msg.Seq + 1
			return msg, nil
		}
		if m.ctx.Err() != nil {
			return port.Message{}, port.Wrap(port.ErrClosed, errors.New("sim: the read was stopped"))
		}
		if err := ctx.Err(); err != nil {
			return port.Message{}, err
		}
		srv := m.p.n.s.srv
		from := m.next
		c := m.p.start("log.pull "+strconv.FormatUint(from, 10), nil, pullWait+2*time.Second, func(answer func(any, error)) {
			srv.fetchLog(from, 1, pullWait, func(msgs []port.Message) { answer(msgs, nil) })
		})
		wctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(m.ctx, cancel)
		v, err := c.wait(wctx)
		stop()
		cancel()
		switch {
		case m.ctx.Err() != nil:
			return port.Message{}, port.Wrap(port.ErrClosed, errors.New("sim: the read was stopped"))
		case ctx.Err() != nil:
			return port.Message{}, ctx.Err()
		case err != nil:
			return port.Message{}, err // transient: the caller asks again
		}
		for _, msg := range v.([]port.Message) {
			if msg.Seq >= m.next {
				m.buf = append(m.buf, msg)
			}
		}
	}
}

func (m *messages) Stop() { m.cancel() }

// queuePort is the task queue.
type queuePort struct{ p nodePorts }

func (q queuePort) Publish(ctx context.Context, msgID string, data []byte) error {
	_, err := q.p.do(ctx, "tasks.publish "+msgID, data, func() (any, error) {
		q.p.n.s.srv.tasks.publish(msgID, data)
		return nil, nil
	})
	return err
}

func (q queuePort) PublishAsync(msgID string, data []byte) (port.Ack, error) {
	c := q.p.start("tasks.publish "+msgID, data, defaultTimeout, func(answer func(any, error)) {
		q.p.n.s.srv.tasks.publish(msgID, data)
		answer(nil, nil)
	})
	return ack{c}, nil
}

type ack struct{ c *pcall }

func (a ack) Wait(ctx context.Context) error {
	_, err := a.c.wait(ctx)
	return err
}

func (q queuePort) Consumer(ctx context.Context) (port.Consumer, error) {
	if _, err := q.p.do(ctx, "tasks.consumer", nil, func() (any, error) { return nil, nil }); err != nil {
		return nil, err
	}
	return consumer(q), nil
}

type consumer struct{ p nodePorts }

// Fetch asks the server for a task, which waits up to three quarters of wait for one
// and then answers "nothing": a fetch that gets no answer at all within wait (a link
// down) is an error, silence.
func (c consumer) Fetch(ctx context.Context, n int, wait time.Duration) ([]port.Delivery, error) {
	q := c.p.n.s.srv.tasks
	call := c.p.start("tasks.fetch", nil, wait, func(answer func(any, error)) {
		q.fetch(wait*3/4, func(d *taskDelivery) { answer(d, nil) })
	})
	v, err := call.wait(ctx)
	if err != nil {
		return nil, err
	}
	d := v.(*taskDelivery)
	if d == nil {
		return nil, nil
	}
	return []port.Delivery{delivery{c.p, d}}, nil
}

type delivery struct {
	p nodePorts
	d *taskDelivery
}

func (d delivery) Data() []byte { return d.d.data }

// Ack, Nak and Term go out without waiting, as nats.go's do.
func (d delivery) Ack() error {
	q := d.p.n.s.srv.tasks
	d.p.start("tasks.ack "+strconv.FormatUint(d.d.id, 10), nil, 0, func(answer func(any, error)) { q.ack(d.d.id); answer(nil, nil) })
	return nil
}

func (d delivery) Nak(delay time.Duration) error {
	q := d.p.n.s.srv.tasks
	d.p.start("tasks.nak "+strconv.FormatUint(d.d.id, 10), nil, 0, func(answer func(any, error)) { q.nak(d.d.id, delay); answer(nil, nil) })
	return nil
}

func (d delivery) Term() error { return d.Ack() }

// dlqPort publishes dead-letter notices.
type dlqPort struct{ p nodePorts }

func (d dlqPort) Publish(ctx context.Context, subject, msgID string, data []byte) error {
	_, err := d.p.do(ctx, "dlq.publish "+msgID, data, func() (any, error) {
		d.p.n.s.srv.dlq[msgID] = true
		return nil, nil
	})
	return err
}

// objectsPort is the snapshots' store.
type objectsPort struct{ p nodePorts }

func (o objectsPort) Put(ctx context.Context, name string, headers map[string]string, r io.Reader) (port.Object, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return port.Object{}, err
	}
	v, err := o.p.do(ctx, "obj.put "+name, data, func() (any, error) { return o.p.n.s.srv.putObject(name, headers, data) })
	if err != nil {
		return port.Object{}, err
	}
	return v.(port.Object), nil
}

func (o objectsPort) Rename(ctx context.Context, name, to string, headers map[string]string) error {
	_, err := o.p.do(ctx, "obj.rename "+name+" "+to, nil, func() (any, error) { return nil, o.p.n.s.srv.renameObject(name, to, headers) })
	return err
}

func (o objectsPort) Get(ctx context.Context, name string) (io.ReadCloser, port.Object, error) {
	type got struct {
		r io.ReadCloser
		o port.Object
	}
	v, err := o.p.do(ctx, "obj.get "+name, nil, func() (any, error) {
		r, obj, err := o.p.n.s.srv.getObject(name)
		return got{r, obj}, err
	})
	if err != nil {
		return nil, port.Object{}, err
	}
	g := v.(got)
	return g.r, g.o, nil
}

func (o objectsPort) List(ctx context.Context) ([]port.Object, error) {
	v, err := o.p.do(ctx, "obj.list", nil, func() (any, error) { return o.p.n.s.srv.listObjects(), nil })
	if err != nil {
		return nil, err
	}
	return v.([]port.Object), nil
}

func (o objectsPort) Delete(ctx context.Context, name string) error {
	_, err := o.p.do(ctx, "obj.delete "+name, nil, func() (any, error) {
		delete(o.p.n.s.srv.objects, name)
		return nil, nil
	})
	return err
}

// termsPort raises the leader bucket's terms (every simulated node has the admin path).
type termsPort struct{ p nodePorts }

func (t termsPort) RaiseTerms(ctx context.Context, above int64) error {
	_, err := t.p.do(ctx, "kv.raise "+strconv.FormatInt(above, 10), nil, func() (any, error) {
		t.p.n.s.srv.kv[port.LeaderBucket].raise(uint64(above))
		return nil, nil
	})
	return err
}
