package protocol_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpucr/gpucr/internal/testroot"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestProtocolDocumentNamesEveryMessage: docs/helper-protocol.md names
// every message and enum of helper.proto (nested ones too), in backticks,
// so that a message added to the protocol without a word on it fails here.
func TestProtocolDocumentNamesEveryMessage(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testroot.Dir(t), "docs", "helper-protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := protocolNames(helperpb.File_protocol_helper_proto)
	if len(names) < 60 {
		t.Fatalf("helper.proto as read has %d messages and enums: %v", len(names), names)
	}
	for _, n := range names {
		if !namedIn(doc, n) {
			t.Errorf("docs/helper-protocol.md does not name %s of helper.proto (in backticks: `%s` or `%s{...}`)", n, n, n)
		}
	}
}

// TestProtocolDocumentCheckFails: the check finds a name that is missing,
// and is not fooled by the name as a plain word or the start of another.
func TestProtocolDocumentCheckFails(t *testing.T) {
	doc := []byte("A Phase is a step; `Phases` and `Transfer.changed`, `Restored{pid}`.")
	for n, want := range map[string]bool{"Phase": false, "Transfer": true, "Restored": true, "Restore": false} {
		if got := namedIn(doc, n); got != want {
			t.Errorf("namedIn(%q) = %v, want %v", n, got, want)
		}
	}
}

func namedIn(doc []byte, name string) bool {
	return regexp.MustCompile("`" + regexp.QuoteMeta(name) + `([^A-Za-z0-9_]|$)`).Match(doc)
}

// protocolNames lists every message and enum of fd by its name within the
// package: Transfer, Transfer.Direction.
func protocolNames(fd protoreflect.FileDescriptor) []string {
	var out []string
	var msgs func(ms protoreflect.MessageDescriptors)
	name := func(d protoreflect.Descriptor) string {
		return strings.TrimPrefix(string(d.FullName()), string(fd.Package())+".")
	}
	enums := func(es protoreflect.EnumDescriptors) {
		for i := 0; i < es.Len(); i++ {
			out = append(out, name(es.Get(i)))
		}
	}
	msgs = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			m := ms.Get(i)
			out = append(out, name(m))
			enums(m.Enums())
			msgs(m.Messages())
		}
	}
	enums(fd.Enums())
	msgs(fd.Messages())
	return out
}
