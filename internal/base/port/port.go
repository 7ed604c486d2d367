package port

import (
	"context"
	"io"
	"time"
)

// Op is what a KV entry records.
type Op int

const (
	// OpPut is a value written.
	OpPut Op = iota
	// OpDelete is a delete.
	OpDelete
	// OpPurge is a purge, or the marker the server writes when a key lapses by the
	// bucket's TTL: a lease that was not renewed.
	OpPurge
)

func (o Op) String() string {
	switch o {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	default:
		return "purge"
	}
}

// Entry is one revision of a key.
type Entry struct {
	Key      string
	Value    []byte
	Revision uint64 // the bucket's sequence of this write: only grows
	Op       Op
	Created  time.Time // on the server's clock
}

// KV is a key-value bucket whose keys may lapse by the bucket's TTL (the leader key, the
// run leases, the nodes' reports, the cluster's roster).
type KV interface {
	// Bucket names the bucket.
	Bucket() string
	// Create writes key only if it holds no value (never written, deleted or lapsed):
	// ErrKeyExists otherwise. It returns the write's revision.
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	// Update writes key only if rev is its last revision: ErrWrongRevision otherwise
	// (also when the key was deleted or lapsed since). It returns the new revision.
	Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error)
	// Put writes key whatever it holds.
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	// Delete deletes key; with rev > 0 only if rev is its last revision
	// (ErrWrongRevision otherwise).
	Delete(ctx context.Context, key string, rev uint64) error
	// Get reads key's newest value as any server of the bucket has it (a replica may lag):
	// ErrKeyNotFound if it holds none.
	Get(ctx context.Context, key string) (Entry, error)
	// Latest reads key's newest revision through the bucket's leader, deletes and
	// lapse markers included (Op says which): the read before a compare-and-set.
	// ErrKeyNotFound if the key was never written (or its history was purged).
	Latest(ctx context.Context, key string) (Entry, error)
	// Revision reads key's write at revision rev through the bucket's leader:
	// ErrKeyNotFound if the bucket no longer keeps it (it keeps its History revisions
	// of a key) or rev is not key's.
	Revision(ctx context.Context, key string, rev uint64) (Entry, error)
	// Keys lists the keys holding a value.
	Keys(ctx context.Context) ([]string, error)
	// Watch delivers key's changes (every key's with key ""): first the current value of
	// each key holding one, then nil (the initial values are all delivered), then each
	// change as it is made, deletes and lapses included. It ends when ctx ends or Stop.
	Watch(ctx context.Context, key string) (Watcher, error)
	// LastRevision is the bucket's last revision: a watch that delivered it is current.
	LastRevision(ctx context.Context) (uint64, error)
}

// Watcher is a KV watch.
type Watcher interface {
	// Updates delivers the entries; nil once the initial values are delivered. It is
	// closed when the watch ends.
	Updates() <-chan *Entry
	Stop() error
}

// Stream is the log: a stream whose messages are numbered by sequence, deduplicated by
// a message ID for a window of time, and read in order.
type Stream interface {
	// Name names the stream.
	Name() string
	// MaxPayload is the largest message the server takes.
	MaxPayload() int
	// Publish appends data under msgID and returns its sequence. A publish with an ID
	// seen within the duplicate window is not appended again: it returns the first one's
	// sequence. ErrNotFound: no such stream; ErrTooLarge: refused for good.
	Publish(ctx context.Context, msgID string, data []byte) (uint64, error)
	// Info is the stream's identity and extent. ErrNotFound: no such stream.
	Info(ctx context.Context) (StreamInfo, error)
	// NextSeq is the sequence of the first message at or after seq, and false when
	// there is none (every one from seq on was deleted or purged, or seq is past the
	// end). (JetStream's get by subject answers just that.)
	NextSeq(ctx context.Context, seq uint64) (uint64, bool, error)
	// Consume reads the stream in order from sequence from (1: the start; past the first
	// sequence when the stream was purged below it).
	Consume(ctx context.Context, from uint64) (Messages, error)
	// Purge deletes every message below keep.
	Purge(ctx context.Context, keep uint64) error
}

// StreamInfo is a stream's identity and extent.
type StreamInfo struct {
	Created  time.Time // when the stream was created: a stream created again is another log
	FirstSeq uint64    // the first message it holds (LastSeq+1 when empty)
	LastSeq  uint64    // the last message appended
}

// Messages is an ordered read of a stream.
type Messages interface {
	// Next returns the next message, waiting for it until ctx ends (ctx's error) or the
	// read is stopped (ErrClosed). Other errors are transient: call Next again.
	Next(ctx context.Context) (Message, error)
	Stop()
}

// Message is one message of a stream.
type Message struct {
	Seq  uint64
	ID   string // the publisher's message ID
	Data []byte
}

// Queue is the task queue: a work queue whose messages a consumer takes one at a time,
// each delivered again after an ack wait unless acknowledged, deduplicated by a message
// ID for a window of time.
type Queue interface {
	// Publish queues data under msgID and waits for the server's acknowledgement.
	Publish(ctx context.Context, msgID string, data []byte) error
	// PublishAsync queues data without waiting: the Ack says how it went.
	PublishAsync(msgID string, data []byte) (Ack, error)
	// Consumer looks the workers' consumer up (creating it, and the queue, if missing).
	Consumer(ctx context.Context) (Consumer, error)
}

// Ack is a publish's outcome to come.
type Ack interface {
	// Wait waits for it: nil when the server acknowledged the message.
	Wait(ctx context.Context) error
}

// Consumer takes messages from the queue.
type Consumer interface {
	// Fetch takes up to max messages, waiting at most wait for the first: none and no
	// error when there was nothing. ErrNotFound: the consumer or the queue is gone
	// (look it up again).
	Fetch(ctx context.Context, max int, wait time.Duration) ([]Delivery, error)
}

// Delivery is a message taken from the queue.
type Delivery interface {
	Data() []byte
	// Ack removes it from the queue.
	Ack() error
	// Nak gives it back, delivered again after delay.
	Nak(delay time.Duration) error
	// Term removes it for good: it cannot be handled, ever.
	Term() error
}

// Publisher appends to a stream without reading it (the dead-letter notices).
type Publisher interface {
	Publish(ctx context.Context, subject, msgID string, data []byte) error
}

// StepLogs keeps what steps printed, as messages appended per run, read per run in
// order and removed per run. It is not the log: nothing in it decides anything.
type StepLogs interface {
	// Append appends data to run's messages under msgID (a publish retried within the
	// duplicate window is not appended twice).
	Append(ctx context.Context, run, msgID string, data []byte) error
	// Next is run's first message after sequence after, and false when there is none.
	Next(ctx context.Context, run string, after uint64) (Message, bool, error)
	// Remove removes run's messages.
	Remove(ctx context.Context, run string) error
}

// Objects is an object store (the snapshots of the state).
type Objects interface {
	// Put stores r under name with headers, replacing nothing: ErrKeyExists if name is
	// taken.
	Put(ctx context.Context, name string, headers map[string]string, r io.Reader) (Object, error)
	// Rename gives the object name the name to (with headers); ErrKeyExists if to is
	// taken.
	Rename(ctx context.Context, name, to string, headers map[string]string) error
	// Get opens an object for reading: ErrNotFound if there is none.
	Get(ctx context.Context, name string) (io.ReadCloser, Object, error)
	// List lists the objects.
	List(ctx context.Context) ([]Object, error)
	// Delete deletes an object.
	Delete(ctx context.Context, name string) error
}

// Object describes a stored object.
type Object struct {
	Name     string
	Size     uint64
	Modified time.Time
	Headers  map[string]string
}
