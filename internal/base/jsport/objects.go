package jsport

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/base/port"
)

// Objects is a port.Objects on a JetStream object store, created at the first write
// (a node that only lists or reads creates nothing).
type Objects struct {
	js  jetstream.JetStream
	cfg jetstream.ObjectStoreConfig
}

var _ port.Objects = (*Objects)(nil)

// ObjectsOf is the object store cfg describes.
func ObjectsOf(js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) *Objects {
	return &Objects{js: js, cfg: cfg}
}

func (o *Objects) open(ctx context.Context, create bool) (jetstream.ObjectStore, error) {
	obs, err := o.js.ObjectStore(ctx, o.cfg.Bucket)
	if create && (errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)) {
		obs, err = o.js.CreateObjectStore(ctx, o.cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			obs, err = o.js.ObjectStore(ctx, o.cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jsport: object store %s: %w", o.cfg.Bucket, mapErr(err))
	}
	return obs, nil
}

func objectOf(in *jetstream.ObjectInfo) port.Object {
	h := map[string]string{}
	for k := range in.Headers {
		h[k] = in.Headers.Get(k)
	}
	return port.Object{Name: in.Name, Size: in.Size, Modified: in.ModTime, Headers: h}
}

func headersOf(h map[string]string) nats.Header {
	if len(h) == 0 {
		return nil
	}
	out := nats.Header{}
	for k, v := range h {
		out.Set(k, v)
	}
	return out
}

// Put implements port.Objects.
func (o *Objects) Put(ctx context.Context, name string, headers map[string]string, r io.Reader) (port.Object, error) {
	obs, err := o.open(ctx, true)
	if err != nil {
		return port.Object{}, err
	}
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name, Headers: headersOf(headers)}, r)
	if err != nil {
		return port.Object{}, mapErr(err)
	}
	return objectOf(info), nil
}

// Rename implements port.Objects.
func (o *Objects) Rename(ctx context.Context, name, to string, headers map[string]string) error {
	obs, err := o.open(ctx, false)
	if err != nil {
		return err
	}
	return mapErr(obs.UpdateMeta(ctx, name, jetstream.ObjectMeta{Name: to, Headers: headersOf(headers)}))
}

// Get implements port.Objects.
func (o *Objects) Get(ctx context.Context, name string) (io.ReadCloser, port.Object, error) {
	obs, err := o.open(ctx, false)
	if err != nil {
		return nil, port.Object{}, err
	}
	r, err := obs.Get(ctx, name)
	if err != nil {
		return nil, port.Object{}, mapErr(err)
	}
	info, err := r.Info()
	if err != nil {
		r.Close()
		return nil, port.Object{}, mapErr(err)
	}
	return r, objectOf(info), nil
}

// List implements port.Objects: none when the store does not exist.
func (o *Objects) List(ctx context.Context) ([]port.Object, error) {
	obs, err := o.open(ctx, false)
	if errors.Is(err, port.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	infos, err := obs.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, mapErr(err)
	}
	var out []port.Object
	for _, in := range infos {
		if !in.Deleted {
			out = append(out, objectOf(in))
		}
	}
	return out, nil
}

// Delete implements port.Objects.
func (o *Objects) Delete(ctx context.Context, name string) error {
	obs, err := o.open(ctx, false)
	if err != nil {
		return err
	}
	return mapErr(obs.Delete(ctx, name))
}
