package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestTakesFDAsDocumented: the requests that may carry a descriptor are
// those docs/helper-protocol.md lists, no more and no fewer: each variant
// of Request is asked of takesFD.
func TestTakesFDAsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testroot.Dir(t), "docs", "helper-protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	const start, end = "The helper accepts a descriptor with a request only on ", "; any other"
	i := strings.Index(text, start)
	if i < 0 {
		t.Fatalf("docs/helper-protocol.md has no %q", start)
	}
	listed := text[i+len(start):]
	listed = listed[:strings.Index(listed, end)]
	var documented []string
	for _, m := range regexp.MustCompile("`([A-Za-z]+)`").FindAllStringSubmatch(listed, -1) {
		documented = append(documented, m[1])
	}
	var taking []string
	req := (&helperpb.Request{}).ProtoReflect()
	oneof := req.Descriptor().Oneofs().ByName("body")
	for j := 0; j < oneof.Fields().Len(); j++ {
		f := oneof.Fields().Get(j)
		r := &helperpb.Request{}
		m := r.ProtoReflect()
		m.Set(f, m.NewField(f))
		if takesFD(r) {
			taking = append(taking, string(f.Message().Name()))
		}
	}
	slices.Sort(documented)
	slices.Sort(taking)
	if len(taking) == 0 || !slices.Equal(documented, taking) {
		t.Errorf("requests that take a descriptor: the helper's %v, the document's %v", taking, documented)
	}
}
