package testfixture

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that goroutines may write and read at once: the
// output of a logger or of a child process that a test reads while it
// runs.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
