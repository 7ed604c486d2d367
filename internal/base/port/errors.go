package port

import "errors"

// The outcomes the shell tells apart. An implementation wraps them with its own error,
// so that both errors.Is(err, port.ErrKeyExists) and the implementation's own sentinel
// hold (Wrap).
var (
	// ErrKeyExists: Create found the key holding a value.
	ErrKeyExists = errors.New("port: key exists")
	// ErrWrongRevision: an Update or a conditional Delete named a revision that is not
	// the key's last.
	ErrWrongRevision = errors.New("port: wrong last revision")
	// ErrKeyNotFound: the key has no value (never written, deleted, or lapsed).
	ErrKeyNotFound = errors.New("port: key not found")
	// ErrInvalidKey: the key is not one a bucket can hold.
	ErrInvalidKey = errors.New("port: invalid key")
	// ErrNotFound: the bucket, stream, consumer or message does not exist.
	ErrNotFound = errors.New("port: not found")
	// ErrTooLarge: a message above the server's limit, or one it refuses for good (a
	// bad subject): sending it again cannot help.
	ErrTooLarge = errors.New("port: message refused")
	// ErrClosed: the iterator or watch was stopped.
	ErrClosed = errors.New("port: closed")
)

// Wrap returns err marked as sentinel: errors.Is holds for both, and the message is
// err's.
func Wrap(sentinel, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sentinel) {
		return err
	}
	return &wrapped{sentinel: sentinel, err: err}
}

type wrapped struct{ sentinel, err error }

func (w *wrapped) Error() string   { return w.err.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.sentinel, w.err} }
