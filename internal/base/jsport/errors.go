package jsport

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// mapErr marks a JetStream error with the port's sentinel it means (the message and the
// JetStream sentinel stay: errors.Is holds for both).
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyExists):
		// On R3 an Update can fail with "wrong last sequence" (10071) that nats.go maps to
		// ErrKeyExists for a Create; for an Update it is the revision that did not match.
		return port.Wrap(port.ErrKeyExists, err)
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return port.Wrap(port.ErrKeyNotFound, err)
	case errors.Is(err, jetstream.ErrInvalidKey):
		return port.Wrap(port.ErrInvalidKey, err)
	case errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, nats.ErrStreamNotFound), errors.Is(err, nats.ErrBucketNotFound),
		errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrMsgNotFound),
		errors.Is(err, jetstream.ErrObjectNotFound), errors.Is(err, jetstream.ErrNoObjectsFound):
		return port.Wrap(port.ErrNotFound, err)
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrMaxPayload):
		return port.Wrap(port.ErrTooLarge, err)
	case errors.Is(err, jetstream.ErrMsgIteratorClosed), errors.Is(err, jetstream.ErrConsumerDeleted):
		return port.Wrap(port.ErrClosed, err)
	case errors.Is(err, jetstream.ErrObjectAlreadyExists):
		return port.Wrap(port.ErrKeyExists, err)
	}
	return err
}

// mapUpdateErr is mapErr for a compare-and-set: a conflict is a wrong revision (nats.go
// reports R3's 10164 and R1's "wrong last sequence" differently).
func mapUpdateErr(err error) error {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return port.Wrap(port.ErrWrongRevision, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return port.Wrap(port.ErrWrongRevision, err)
	}
	return mapErr(err)
}

// withDefaultTimeout bounds a call whose caller set no deadline, as JetStream's own
// calls get its default timeout.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
