package idem_test

import (
	"bytes"
	"go/format"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every ```go block in the repository's markdown (README.md, docs/, the
// examples' READMEs) is compiled: it must appear, line for line
// (indentation and blank lines aside), in a Go file of the repository,
// which go vet and the tests build, so a block that names something that
// does not exist, or no longer compiles, fails here or there. And it must
// be gofmt'd as it is printed.
//
// The Go files that hold the blocks are the runnable examples and tests
// themselves where they can be (example_runner_test.go holds the README's
// quick start, examples/orders the testing and sqlc guides'), and
// examples/internal/docsnippets for the fragments that need a made-up
// application around them.
func TestDocCodeBlocksAreCompiled(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("go.work"); err != nil {
		t.Skip("not a checkout of the repository: the examples' files are not here")
	}
	var goFiles [][]string
	var docs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".go"):
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			goFiles = append(goFiles, normalizedLines(string(src)))
		case strings.HasSuffix(path, ".md") && path != "CHANGELOG.md":
			docs = append(docs, path)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, docs)

	blocks := 0
	for _, doc := range docs {
		src, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, b := range goBlocks(string(src)) {
			blocks++
			formatted, err := format.Source([]byte(b.code))
			if err != nil {
				t.Errorf("%s:%d: the go block does not parse: %v", doc, b.line, err)
			} else if !bytes.Equal(formatted, []byte(b.code)) {
				t.Errorf("%s:%d: the go block is not gofmt'd; gofmt prints:\n%s", doc, b.line, formatted)
			}
			want := normalizedLines(b.code)
			found := false
			for _, lines := range goFiles {
				if containsRun(lines, want) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s:%d: no Go file in the repository holds this go block, so nothing compiles it; put it in an example, a test or examples/internal/docsnippets:\n%s", doc, b.line, b.code)
			}
		}
	}
	require.Positive(t, blocks)
}

type codeBlock struct {
	line int
	code string
}

// goBlocks returns the ```go blocks of a markdown document, each without
// the indentation of its fence (a block inside a list item).
func goBlocks(doc string) []codeBlock {
	var out []codeBlock
	lines := strings.Split(doc, "\n")
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " ")
		if trimmed != "```go" {
			continue
		}
		indent := lines[i][:len(lines[i])-len(trimmed)]
		var b strings.Builder
		start := i + 1
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			b.WriteString(strings.TrimPrefix(lines[i], indent) + "\n")
		}
		out = append(out, codeBlock{line: start, code: b.String()})
	}
	return out
}

// normalizedLines is src's lines without their indentation, blank lines
// left out.
func normalizedLines(src string) []string {
	var out []string
	for line := range strings.SplitSeq(src, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

// containsRun reports whether want occurs in lines as a contiguous run.
func containsRun(lines, want []string) bool {
	if len(want) == 0 {
		return true
	}
	for i := 0; i+len(want) <= len(lines); i++ {
		if lines[i] == want[0] && equalRun(lines[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

func equalRun(a, b []string) bool {
	for i := range b {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
