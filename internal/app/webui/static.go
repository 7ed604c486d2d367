package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The templates and the static files are embedded apart: /ui/static/ serves the files of
// staticTypes from staticFS and nothing else (no directory listing, no template, no
// other file that may one day be added under assets).

//go:embed assets/templates/*.html
var templateFS embed.FS

//go:embed assets/ui.css assets/ui.js
var staticFS embed.FS

// staticTypes are the files /ui/static/ serves, with their types.
var staticTypes = map[string]string{
	"ui.css": "text/css; charset=utf-8",
	"ui.js":  "text/javascript; charset=utf-8",
}

type staticFile struct {
	body        []byte
	ctype, etag string
}

func loadStatic() (map[string]staticFile, error) {
	files := map[string]staticFile{}
	for name, ctype := range staticTypes {
		b, err := staticFS.ReadFile("assets/" + name)
		if err != nil {
			return nil, fmt.Errorf("webui: static file %s: %w", name, err)
		}
		sum := sha256.Sum256(b)
		files[name] = staticFile{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	}
	return files, nil
}

// serveStatic serves one of the static files by its name; anything else under
// /ui/static/ (the directory itself, templates, other paths) is 404. The ETag lets a
// browser revalidate (the files change with the binary).
func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request) {
	f, ok := s.static[strings.TrimPrefix(r.URL.Path, "/ui/static/")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", f.ctype)
	h.Set("ETag", f.etag)
	h.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}
