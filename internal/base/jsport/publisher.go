package jsport

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// Publisher is a port.Publisher on JetStream.
type Publisher struct{ js jetstream.JetStream }

var _ port.Publisher = Publisher{}

// Publish implements port.Publisher.
func (p Publisher) Publish(ctx context.Context, subject, msgID string, data []byte) error {
	_, err := p.js.Publish(ctx, subject, data, jetstream.WithMsgID(msgID))
	return mapErr(err)
}

// PublisherOf publishes through js.
func PublisherOf(js jetstream.JetStream) Publisher { return Publisher{js} }
