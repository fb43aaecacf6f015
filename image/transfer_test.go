package image

// The migration's transfer (transfer.go): an image directory sent and
// received whole; what the sender leaves out; hostile archives refused,
// with nothing made outside the receiving directory; the receiving
// directory's rules; and its removal, which follows nothing.

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fxRecvTree describes every entry under dir: its path relative to dir, type
// and permissions, owner, and a small file's content.
func fxRecvTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := fi.Sys().(*syscall.Stat_t)
		s := fmt.Sprintf("%s %v uid %d", rel, fi.Mode(), st.Uid)
		if fi.Mode().IsRegular() && fi.Size() < 64 {
			b, _ := os.ReadFile(p)
			s += fmt.Sprintf(" %q", b)
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fxPut(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// fxReceive receives stream into dir/name (made new).
func fxReceive(t testing.TB, dir, name string, stream []byte) (*Receiver, ReceiveResult, error) {
	t.Helper()
	r, err := NewReceiver(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("NewReceiver: %v", err)
	}
	defer r.Close()
	res, err := r.Receive(bytes.NewReader(stream))
	return r, res, err
}

// An image directory goes over whole, as directories 0700 and files 0600
// of the receiving user, whatever modes they had; Only leaves out what it
// refuses, a refused directory with its content; a later part goes into
// the same directory.
func TestSendReceive(t *testing.T) {
	src := t.TempDir()
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: past one buffer
	fxPut(t, filepath.Join(src, "inventory.img"), []byte("inv"))
	fxPut(t, filepath.Join(src, "empty"), nil)
	fxPut(t, filepath.Join(src, "gpucr", "chunks", "ab", "abcd"), big)
	fxPut(t, filepath.Join(src, "gpucr", "manifest.pb"), []byte("m"))
	fxPut(t, filepath.Join(src, "gpucr-pre-copy", "1-7", "x"), []byte("round"))
	if err := os.Chmod(filepath.Join(src, "inventory.img"), 0o644); err != nil {
		t.Fatal(err)
	}
	notPreCopy := func(rel string) bool { return !strings.HasPrefix(rel, "gpucr-pre-copy") }
	var b bytes.Buffer
	res, err := Send(&b, src, SendOptions{Only: notPreCopy, Owner: &Owner{UID: os.Geteuid()}})
	if err != nil || res.Bytes != int64(3+len(big)+1) || res.Files != 4 || len(res.NotSent) != 0 {
		t.Fatalf("Send: %+v, %v", res, err)
	}
	dst := t.TempDir()
	r, got, err := fxReceive(t, dst, "img", b.Bytes())
	if err != nil || got.Files != 4 || got.Dirs != 3 || got.Bytes != res.Bytes {
		t.Fatalf("Receive: %+v, %v", got, err)
	}
	if !r.Made() {
		t.Error("a new directory was not made")
	}
	if c, err := os.ReadFile(filepath.Join(dst, "img", "gpucr", "chunks", "ab", "abcd")); err != nil || !bytes.Equal(c, big) {
		t.Errorf("the big file came over as %d bytes, %v", len(c), err)
	}
	uid := uint32(os.Geteuid())
	for _, e := range fxRecvTree(t, filepath.Join(dst, "img")) {
		if !strings.Contains(e, fmt.Sprintf("uid %d", uid)) || !(strings.Contains(e, " drwx------ ") || strings.Contains(e, " -rw------- ")) {
			t.Errorf("received %s, want directories 0700 and files 0600 of uid %d", e, uid)
		}
		if strings.HasPrefix(e, "gpucr-pre-copy") {
			t.Errorf("Only refused it, and it came: %s", e)
		}
	}
	// The second part: the pre-copy rounds, into the directory the first
	// one made.
	b.Reset()
	if _, err := Send(&b, src, SendOptions{Only: func(rel string) bool { return !notPreCopy(rel) }}); err != nil {
		t.Fatal(err)
	}
	r2, err := OpenReceiver(filepath.Join(dst, "img"), r.ID())
	if err != nil {
		t.Fatalf("OpenReceiver: %v", err)
	}
	defer r2.Close()
	if _, err := r2.Receive(&b); err != nil {
		t.Fatalf("the second part: %v", err)
	}
	if c, err := os.ReadFile(filepath.Join(dst, "img", "gpucr-pre-copy", "1-7", "x")); err != nil || string(c) != "round" {
		t.Errorf("the second part's file: %q, %v", c, err)
	}
	if _, err := OpenReceiver(filepath.Join(dst, "img"), DirID{r.ID().Dev, r.ID().Ino + 1}); err == nil {
		t.Error("OpenReceiver of another directory's identity")
	}
}

// The sender opens what it sends without following a link, and sends only
// directories and regular files of Owner: a symlink (to a file only root
// reads), a FIFO, and another user's file and directory are left out and
// named, and nothing of their content goes.
func TestSendLeavesOut(t *testing.T) {
	src := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	fxPut(t, secret, []byte("SECRET"))
	fxPut(t, filepath.Join(src, "mine"), []byte("mine"))
	if err := os.Symlink(secret, filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(secret), filepath.Join(src, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{"dirlink: symlink", "fifo: FIFO", "link: symlink"}
	if os.Geteuid() == 0 {
		fxPut(t, filepath.Join(src, "theirs"), []byte("SECRET"))
		fxPut(t, filepath.Join(src, "theirdir", "f"), []byte("SECRET"))
		for _, p := range []string{"theirs", "theirdir"} {
			if err := os.Chown(filepath.Join(src, p), ownerA.UID, ownerA.GID); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, "theirdir: belongs to uid 61001", "theirs: belongs to uid 61001")
	}
	var b bytes.Buffer
	res, err := Send(&b, src, SendOptions{Owner: &Owner{UID: os.Geteuid()}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(res.NotSent); !slices.Equal(res.NotSent, want) {
		t.Errorf("not sent: %q, want %q", res.NotSent, want)
	}
	if bytes.Contains(b.Bytes(), []byte("SECRET")) {
		t.Error("the stream holds what the symlink or another user's file holds")
	}
	tr := tar.NewReader(&b)
	var names []string
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if !slices.Equal(names, []string{"mine"}) {
		t.Errorf("sent %q, want only mine", names)
	}
}

// fxEntry is one entry of a hand-made archive.
type fxEntry struct {
	name string
	typ  byte
	body string
	link string
}

func fxArchive(t testing.TB, entries ...fxEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o4777, Linkname: e.link, Uid: 61001, Gid: 61001}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("%s: %v", e.name, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fxHostile are archives the receiver refuses, each with what the refusal
// names.
func fxHostile(t testing.TB) map[string]struct {
	data []byte
	want string
} {
	reg := func(name, body string) fxEntry { return fxEntry{name: name, typ: tar.TypeReg, body: body} }
	dir := func(name string) fxEntry { return fxEntry{name: name, typ: tar.TypeDir} }
	out := map[string]struct {
		data []byte
		want string
	}{}
	add := func(name, want string, entries ...fxEntry) {
		out[name] = struct {
			data []byte
			want string
		}{fxArchive(t, entries...), want}
	}
	add("dotdot", `".." in the name`, reg("../x", "escaped"))
	add("dotdot-inside", `".." in the name`, dir("a"), reg("a/../../x", "escaped"))
	add("absolute", "an absolute name", reg("/tmp/gpucr-received-absolute", "escaped"))
	add("absolute-etc", "an absolute name", reg("/etc/gpucr-received-absolute", "escaped"))
	add("dot", `"." component`, reg("./x", "x"))
	add("double-slash", "empty or", dir("a"), reg("a//x", "x"))
	add("symlink", "is a symlink", fxEntry{name: "l", typ: tar.TypeSymlink, link: "/etc"}, reg("l/x", "through"))
	add("hardlink", "is a hard link", fxEntry{name: "h", typ: tar.TypeLink, link: "/etc/passwd"})
	add("char", "is a character device", fxEntry{name: "c", typ: tar.TypeChar})
	add("block", "is a block device", fxEntry{name: "b", typ: tar.TypeBlock})
	add("fifo", "is a FIFO", fxEntry{name: "p", typ: tar.TypeFifo})
	add("twice", "is there already", reg("x", "one"), reg("x", "two"))
	add("file-then-dir", "is there already as a regular file", reg("x", "one"), dir("x"))
	add("dir-then-file", "is there already", dir("x"), reg("x", "two"))
	add("no-parent", "is not in the archive before it", reg("a/x", "x"))
	add("under-a-file", "not a directory", reg("a", "file"), reg("a/x", "x"))
	out["sparse"] = struct {
		data []byte
		want string
	}{fxSparse(t), "is a sparse file"}
	return out
}

// fxSparse is an archive of one PAX sparse file (GNU 0.1): 64 MiB that the
// reader makes from a 1-byte data section and a map. tar.Writer writes no
// such records: the PAX header is written as a file, and its type and
// checksum changed.
func fxSparse(t testing.TB) []byte {
	record := func(k, v string) string {
		for l := len(k) + len(v) + 3; ; {
			s := fmt.Sprintf("%d %s=%s\n", l, k, v)
			if len(s) == l {
				return s
			}
			l = len(s)
		}
	}
	recs := record("GNU.sparse.major", "0") + record("GNU.sparse.minor", "1") + record("GNU.sparse.size", "67108864") +
		record("GNU.sparse.numblocks", "1") + record("GNU.sparse.map", "67108863,1")
	data := fxArchive(t, fxEntry{name: "pax", typ: tar.TypeReg, body: recs}, fxEntry{name: "s", typ: tar.TypeReg, body: "x"})
	data[156] = tar.TypeXHeader
	copy(data[148:156], "        ")
	sum := 0
	for _, c := range data[:512] {
		sum += int(c)
	}
	copy(data[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return data
}

// Hostile archives are refused, naming the entry and why; nothing is made
// outside the receiving directory, and nothing inside it is a link or a
// special file or has a mode or owner from the archive.
func TestReceiveHostile(t *testing.T) {
	for name, c := range fxHostile(t) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			_, _, err := fxReceive(t, dir, "img", c.data)
			var ee *EntryError
			if err == nil || !errors.As(err, &ee) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Receive: %v, want an entry refused for %q", err, c.want)
			}
			fxOnlyBeneath(t, dir, "img")
		})
	}
	for _, p := range []string{"/tmp/gpucr-received-absolute", "/etc/gpucr-received-absolute"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the absolute name %s was written", p)
		}
	}
	// A directory twice is no harm (a later part finds its directories).
	dir := t.TempDir()
	if _, res, err := fxReceive(t, dir, "img", fxArchive(t, fxEntry{name: "a/", typ: tar.TypeDir}, fxEntry{name: "a", typ: tar.TypeDir},
		fxEntry{name: "a/x", typ: tar.TypeReg, body: "x"})); err != nil || res.Dirs != 1 || res.Files != 1 {
		t.Errorf("a directory twice: %+v, %v", res, err)
	}
	// A stream cut short fails.
	whole := fxArchive(t, fxEntry{name: "x", typ: tar.TypeReg, body: strings.Repeat("y", 4000)})
	if _, _, err := fxReceive(t, t.TempDir(), "img", whole[:1500]); err == nil {
		t.Error("a stream cut short was received")
	}
}

// fxOnlyBeneath checks that dir holds name alone, and that everything under
// it is a directory (0700) or a regular file (0600) of this process's user.
func fxOnlyBeneath(t testing.TB, dir, name string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != name {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("%s holds %q, want only %s", dir, names, name)
	}
	uid := uint32(os.Geteuid())
	err = filepath.Walk(filepath.Join(dir, name), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		ok := (fi.IsDir() && fi.Mode().Perm() == 0o700 && fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) == 0) ||
			(fi.Mode().IsRegular() && fi.Mode().Perm() == 0o600 && fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) == 0)
		if !ok || st.Uid != uid {
			t.Errorf("received %s: %v, uid %d", p, fi.Mode(), st.Uid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The receiving directory: made new where missing; an empty one that is
// someone else's, or that others may write, is made again as this user's
// 0700; one of this user's 0700 is used as it is; one that holds anything,
// a symlink (not followed) or a file is refused and stays.
func TestNewReceiver(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type receiverCase struct {
		path     string
		made     bool
		err      string
		unchange string // a path whose tree must stay as it is
	}
	cases := []receiverCase{
		{path: filepath.Join(dir, "new"), made: true},
		{path: mk("open", 0o777), made: true},
		{path: mk("sticky", 0o1777), made: true},
		{path: mk("own", 0o700), made: false},
		{path: mk("own-readable", 0o755), made: false},
	}
	full := mk("full", 0o700)
	fxPut(t, filepath.Join(full, "x"), []byte("x"))
	cases = append(cases, receiverCase{path: full, err: "is not empty", unchange: full})
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, receiverCase{path: filepath.Join(dir, "link"), err: "is a symlink", unchange: target})
	fxPut(t, filepath.Join(dir, "file"), []byte("f"))
	cases = append(cases, receiverCase{path: filepath.Join(dir, "file"), err: "is a regular file, not a directory"})
	if os.Geteuid() == 0 {
		theirs := mk("theirs", 0o700)
		if err := os.Chown(theirs, ownerA.UID, ownerA.GID); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, receiverCase{path: theirs, made: true})
	}
	for _, c := range cases {
		var before []string
		if c.unchange != "" {
			before = fxRecvTree(t, c.unchange)
		}
		r, err := NewReceiver(c.path)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.path, err, c.err)
			}
			if err == nil {
				r.Close()
			}
			if c.unchange != "" && !slices.Equal(fxRecvTree(t, c.unchange), before) {
				t.Errorf("%s: %s changed", c.path, c.unchange)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		fi, _ := os.Lstat(c.path)
		st := fi.Sys().(*syscall.Stat_t)
		if r.Made() != c.made || !fi.IsDir() || st.Uid != uint32(os.Geteuid()) || fi.Mode()&0o022 != 0 ||
			(c.made && fi.Mode().Perm() != 0o700) || r.ID() != (DirID{uint64(st.Dev), st.Ino}) {
			t.Errorf("%s: made %v (want %v), %v uid %d, id %v", c.path, r.Made(), c.made, fi.Mode(), st.Uid, r.ID())
		}
		r.Close()
	}
}

// RemoveReceived removes the received directory and what it holds, and
// nothing a symlink in it leads to; it removes nothing where the path
// leads to another directory now (a parent swapped for a symlink to a
// directory with a directory of the same name), and keeps the directory
// itself with keepDir.
func TestRemoveReceived(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	fxPut(t, filepath.Join(outside, "keep"), []byte("keep"))
	before := fxRecvTree(t, outside)
	p := filepath.Join(dir, "p")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(p, "img")
	r, _, err := fxReceive(t, p, "img", fxArchive(t, fxEntry{name: "a", typ: tar.TypeDir},
		fxEntry{name: "a/x", typ: tar.TypeReg, body: "x"}, fxEntry{name: "y", typ: tar.TypeReg, body: "y"}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.ID()
	// links a process of this user's could have left there
	if err := os.Symlink(outside, filepath.Join(img, "a", "link")); err != nil {
		t.Fatal(err)
	}
	// The parent swapped for a symlink to a directory that holds an img.
	elsewhere := filepath.Join(dir, "elsewhere")
	fxPut(t, filepath.Join(elsewhere, "img", "keep"), []byte("keep"))
	if err := os.Rename(p, p+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, p); err != nil {
		t.Fatal(err)
	}
	if err := RemoveReceived(img, id, false); err == nil || !strings.Contains(err.Error(), "is not the directory the image was received into") {
		t.Errorf("RemoveReceived through the swapped parent: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(elsewhere, "img", "keep")); err != nil || string(b) != "keep" {
		t.Errorf("the other img lost its file: %q, %v", b, err)
	}
	// Put back: removed, and the symlink's target stays.
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".moved", p); err != nil {
		t.Fatal(err)
	}
	if err := RemoveReceived(img, id, true); err != nil {
		t.Fatalf("RemoveReceived, keeping the directory: %v", err)
	}
	if ents, err := os.ReadDir(img); err != nil || len(ents) != 0 {
		t.Errorf("kept directory holds %v, %v", ents, err)
	}
	if err := RemoveReceived(img, id, false); err != nil {
		t.Fatalf("RemoveReceived: %v", err)
	}
	if _, err := os.Lstat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s stays: %v", img, err)
	}
	if !slices.Equal(fxRecvTree(t, outside), before) {
		t.Error("what the symlink leads to changed")
	}
	if err := RemoveReceived(img, id, false); err != nil {
		t.Errorf("RemoveReceived of what is gone: %v", err)
	}
}

// fxSpecArchive makes the archive a fuzz input describes: one entry a
// line, its tar type byte, its name, and for a file "=" and its content
// ("0a/b=hi": the file a/b); an entry tar.Writer refuses is left out. Cut
// at cut bytes if cut is within it (a stream ended midway).
func fxSpecArchive(spec string, cut int) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, line := range strings.Split(spec, "\n") {
		if line == "" {
			continue
		}
		typ, rest := line[0], line[1:]
		name, body, _ := strings.Cut(rest, "=")
		h := &tar.Header{Typeflag: typ, Name: name, Mode: 0o6777, Uid: 61001, Linkname: body}
		if typ == tar.TypeReg {
			h.Size, h.Linkname = int64(len(body)), ""
		}
		if tw.WriteHeader(h) != nil {
			continue
		}
		if typ == tar.TypeReg {
			_, _ = tw.Write([]byte(body))
		}
	}
	_ = tw.Close()
	if cut > 0 && cut < b.Len() {
		b.Truncate(cut)
	}
	return b.Bytes()
}

// FuzzReceive gives the receiver archives of arbitrary entries (names,
// types, order, a stream cut short; seeded with the hostile archives'
// entries and a good image): it never panics, and whatever it accepts or
// refuses, it makes nothing outside the receiving directory and nothing
// inside it but directories 0700 and files 0600 of its user. (The input
// describes the entries, not the archive's bytes: tar's own encoding is
// archive/tar's, and inputs of a few bytes keep the fuzzer fast.)
func FuzzReceive(f *testing.F) {
	for _, seed := range []string{
		"0../x=escaped", "5a\n0a/../../x=escaped", "0/tmp/gpucr-received-fuzz=escaped", "0./x=x", "5a\n0a//x=x",
		"2l=/etc\n0l/x=through", "1h=/etc/passwd", "3c", "4b", "6p", "0x=one\n0x=two", "0x=one\n5x", "5x\n0x=two",
		"0a/x=x", "0a=file\n0a/x=x", "5a/\n5a\n0a/x=x",
		"5gpucr\n0gpucr/manifest.pb=m\n5gpucr/chunks\n0gpucr/chunks/ab=chunk\n0inventory.img=inv",
	} {
		f.Add(seed, uint16(0))
	}
	f.Add("0big="+strings.Repeat("y", 3000), uint16(1500))
	// One directory for every input of this process: the receiver makes
	// img in it, and RemoveReceived takes it away again.
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, spec string, cut uint16) {
		r, err := NewReceiver(filepath.Join(dir, "img"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = r.Receive(bytes.NewReader(fxSpecArchive(spec, int(cut))))
		r.Close()
		fxOnlyBeneath(t, dir, "img")
		if err := RemoveReceived(filepath.Join(dir, "img"), r.ID(), false); err != nil {
			t.Fatalf("RemoveReceived: %v", err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("RemoveReceived left %v", ents)
		}
		if _, err := os.Lstat("/tmp/gpucr-received-fuzz"); err == nil {
			t.Fatal("an absolute name was written")
		}
	})
}
