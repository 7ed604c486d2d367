package jsport

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// Stream is a port.Stream on a JetStream stream with one subject (flow's log).
type Stream struct {
	js      jetstream.JetStream
	name    string
	subject string
}

var _ port.Stream = (*Stream)(nil)

// OpenStream opens the stream cfg describes, creating it if it does not exist (never
// updating it: EnsureStream). Its first subject is the one published to.
func OpenStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (*Stream, error) {
	if _, err := EnsureStream(ctx, js, cfg); err != nil {
		return nil, mapErr(err)
	}
	return &Stream{js: js, name: cfg.Name, subject: cfg.Subjects[0]}, nil
}

// StreamOf is a port.Stream on an existing stream, created by someone else (tools that
// read the log: they never create it).
func StreamOf(js jetstream.JetStream, name, subject string) *Stream {
	return &Stream{js: js, name: name, subject: subject}
}

// Name implements port.Stream.
func (s *Stream) Name() string { return s.name }

// MaxPayload implements port.Stream.
func (s *Stream) MaxPayload() int { return int(s.js.Conn().MaxPayload()) }

// Publish implements port.Stream: with the message ID as Nats-Msg-Id and the stream's
// name expected, so that a message meant for the log never lands in another stream.
func (s *Stream) Publish(ctx context.Context, msgID string, data []byte) (uint64, error) {
	msg := &nats.Msg{Subject: s.subject, Data: data, Header: nats.Header{}}
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(s.name))
	if err != nil {
		return 0, mapErr(err)
	}
	return ack.Sequence, nil
}

// Info implements port.Stream.
func (s *Stream) Info(ctx context.Context) (port.StreamInfo, error) {
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return port.StreamInfo{}, mapErr(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return port.StreamInfo{}, mapErr(err)
	}
	return port.StreamInfo{Created: info.Created, FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq}, nil
}

// NextSeq implements port.Stream: a get by subject answers the first message of the
// subject at or after seq.
func (s *Stream) NextSeq(ctx context.Context, seq uint64) (uint64, bool, error) {
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return 0, false, mapErr(err)
	}
	m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(s.subject))
	if err != nil {
		if err = mapErr(err); isNotFound(err) {
			return 0, false, nil
		}
		return 0, false, err
	}
	return m.Sequence, true, nil
}

// Purge implements port.Stream.
func (s *Stream) Purge(ctx context.Context, keep uint64) error {
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return mapErr(err)
	}
	return mapErr(st.Purge(ctx, jetstream.WithPurgeSequence(keep)))
}

// Consume implements port.Stream: an ordered consumer from sequence from, pulling with
// idle heartbeats every second, so that a consumer whose server went away is noticed
// (two missed) and recreated by the client in seconds, not the default's ten.
func (s *Stream) Consume(ctx context.Context, from uint64) (port.Messages, error) {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := s.js.OrderedConsumer(ctx, s.name, cfg)
	if err != nil {
		return nil, fmt.Errorf("jsport: consume %s: %w", s.name, mapErr(err))
	}
	it, err := cons.Messages(jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return nil, fmt.Errorf("jsport: consume %s: %w", s.name, mapErr(err))
	}
	return messages{it}, nil
}

type messages struct{ it jetstream.MessagesContext }

func (m messages) Next(ctx context.Context) (port.Message, error) {
	msg, err := m.it.Next(jetstream.NextContext(ctx))
	if err != nil {
		return port.Message{}, mapErr(err)
	}
	meta, err := msg.Metadata()
	if err != nil {
		return port.Message{}, fmt.Errorf("jsport: a log message without metadata: %w", err)
	}
	return port.Message{Seq: meta.Sequence.Stream, ID: msg.Headers().Get(jetstream.MsgIDHeader), Data: msg.Data()}, nil
}

func (m messages) Stop() { m.it.Stop() }

func isNotFound(err error) bool { return err != nil && errorsIs(err, port.ErrNotFound) }
