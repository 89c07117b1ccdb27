package main

import (
	stdzip "archive/zip"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"time"

	"golang.org/x/mod/zip"
)

// The zip.File sources: a file of a git archive, a file in the work tree,
// and either under another path.

type archived struct{ f *stdzip.File }

func (a archived) Path() string                 { return a.f.Name }
func (a archived) Lstat() (fs.FileInfo, error)  { return a.f.FileInfo(), nil }
func (a archived) Open() (io.ReadCloser, error) { return a.f.Open() }

type onDisk struct {
	name, path string
	info       fs.FileInfo
}

func (d onDisk) Path() string                 { return d.name }
func (d onDisk) Lstat() (fs.FileInfo, error)  { return d.info, nil }
func (d onDisk) Open() (io.ReadCloser, error) { return os.Open(d.path) }

// written is a file's content given in full, in place of the file of the
// same path.
type written struct {
	name string
	data []byte
}

func (w written) Path() string                 { return w.name }
func (w written) Lstat() (fs.FileInfo, error)  { return writtenInfo{w}, nil }
func (w written) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(w.data)), nil }

type writtenInfo struct{ w written }

func (i writtenInfo) Name() string       { return path.Base(i.w.name) }
func (i writtenInfo) Size() int64        { return int64(len(i.w.data)) }
func (i writtenInfo) Mode() fs.FileMode  { return 0o644 }
func (i writtenInfo) ModTime() time.Time { return time.Time{} }
func (i writtenInfo) IsDir() bool        { return false }
func (i writtenInfo) Sys() any           { return nil }

// replaced is files with the file at name's content replaced by data.
func replaced(files []zip.File, name string, data []byte) []zip.File {
	out := slices.Clone(files)
	for i, f := range out {
		if f.Path() == name {
			out[i] = written{name, data}
			return out
		}
	}
	return append(out, written{name, data})
}

type rerooted struct {
	zip.File
	path string
}

func (r rerooted) Path() string { return r.path }

func zipReader(data []byte) (*stdzip.Reader, error) {
	return stdzip.NewReader(bytes.NewReader(data), int64(len(data)))
}
