package level

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"

	"github.com/gpucr/gpucr/image"
)

// index is an image on a level: its files, by path in the directory.
type index struct {
	Format  int         `json:"format"`
	ImageID string      `json:"image_id"`
	Written time.Time   `json:"written"`
	Files   []indexFile `json:"files"`
}

type indexFile struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Mode   uint32 `json:"mode"`
}

const (
	indexFormat  = 1
	maxIndex     = 64 << 20 // an index's bytes
	maxFiles     = 1 << 20  // files of one image
	manifestPath = image.SubDir + "/manifest.pb"
)

// Stats is what a push or pull moved.
type Stats struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Moved: the bytes that crossed to (push) or from (pull) the store;
	// a push leaves out the blobs the bucket had.
	Moved     int64   `json:"moved_bytes"`
	BlobsHad  int     `json:"blobs_had"`
	Seconds   float64 `json:"seconds"`
	ImageID   string  `json:"image_id"`
	Reference string  `json:"url"`
}

// Progress is how far a push is.
type Progress struct {
	Files, FilesDone             int
	Bytes, BytesDone, BytesMoved int64
}

// skipped says whether a directory entry stays behind: the image's lock
// and temporary files (a write in progress, a crash's leftovers).
func skipped(rel string) bool {
	base := path.Base(rel)
	return base == ".lock" || strings.HasPrefix(base, ".tmp-")
}

// Push copies the committed image in dir (GPU image and CRIU's files: the
// whole directory) to r: every file the bucket lacks as a blob, Jobs at
// once, then the index. Until the index is written the image is not on the
// level; an interrupted push leaves blobs the next one finds.
func (s *Store) Push(ctx context.Context, dir string, r Ref) (Stats, error) {
	t0 := time.Now()
	st := Stats{Reference: r.String()}
	if r.Path == "" {
		return st, fmt.Errorf("%s: no image name after the bucket", r)
	}
	im, err := image.Open(dir)
	if err != nil {
		return st, fmt.Errorf("push %s: %w", dir, err)
	}
	st.ImageID = hex.EncodeToString(im.Manifest().GetImageId())
	im.Close()

	var files []indexFile
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() || rel == "." || skipped(rel) {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file (%v): an image holds none", p, d.Type())
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, indexFile{Path: rel, Size: fi.Size(), Mode: uint32(fi.Mode().Perm())})
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("push %s: %w", dir, err)
	}
	if len(files) > maxFiles {
		return st, fmt.Errorf("push %s: %d files, more than a level takes (%d)", dir, len(files), maxFiles)
	}
	var moved atomic.Int64
	var had atomic.Int64
	var pmu sync.Mutex
	prog := Progress{Files: len(files)}
	for _, f := range files {
		prog.Bytes += f.Size
	}
	progress := func(f *indexFile, sent int64) {
		if s.OnProgress == nil {
			return
		}
		pmu.Lock()
		defer pmu.Unlock()
		prog.FilesDone++
		prog.BytesDone += f.Size
		prog.BytesMoved += sent
		s.OnProgress(prog)
	}
	err = s.each(ctx, len(files), func(ctx context.Context, i int) error {
		f := &files[i]
		sum, err := hashFile(filepath.Join(dir, filepath.FromSlash(f.Path)), f.Size)
		if err != nil {
			return fmt.Errorf("push %s: %w", f.Path, err)
		}
		f.SHA256 = sum
		key := blobKey(sum)
		if info, err := s.c.StatObject(ctx, r.Bucket, key, minio.StatObjectOptions{}); err == nil && info.Size == f.Size {
			had.Add(1)
			progress(f, 0)
			return nil
		} else if err != nil && !notFound(err) {
			return s.storeErr("push: looking for", r, key, err)
		}
		fh, err := os.Open(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			return fmt.Errorf("push %s: %w", f.Path, err)
		}
		defer fh.Close()
		if _, err := s.c.PutObject(ctx, r.Bucket, key, io.LimitReader(fh, f.Size), f.Size,
			minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: f.Size < 64<<20}); err != nil {
			return s.storeErr("push: writing "+f.Path+" to", r, key, err)
		}
		moved.Add(f.Size)
		progress(f, f.Size)
		return nil
	})
	if err != nil {
		return st, err
	}
	slices.SortFunc(files, func(a, b indexFile) int { return strings.Compare(a.Path, b.Path) })
	idx := index{Format: indexFormat, ImageID: st.ImageID, Written: time.Now().UTC(), Files: files}
	body, err := json.Marshal(idx)
	if err != nil {
		return st, err
	}
	if _, err := s.c.PutObject(ctx, r.Bucket, r.indexKey(), strings.NewReader(string(body)), int64(len(body)),
		minio.PutObjectOptions{ContentType: "application/json"}); err != nil {
		return st, s.storeErr("push: writing the index", r, r.indexKey(), err)
	}
	for _, f := range files {
		st.Bytes += f.Size
	}
	st.Files, st.Moved, st.BlobsHad = len(files), moved.Load(), int(had.Load())
	st.Seconds = time.Since(t0).Seconds()
	return st, nil
}

// hashFile is the SHA-256 of the file's first size bytes, which must be all
// of it.
func hashFile(p string, size int64) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, size+1))
	if err != nil {
		return "", err
	}
	if n != size {
		return "", fmt.Errorf("%s changed while it was read (%d bytes, not %d)", p, n, size)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// each runs f(0..n-1), Jobs at once; the first error cancels the rest.
func (s *Store) each(ctx context.Context, n int, f func(context.Context, int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.jobs)
	for i := 0; i < n && gctx.Err() == nil; i++ {
		g.Go(func() error { return f(gctx, i) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err() // the caller's, cancelled before any f failed
}

// readIndex fetches and checks r's index.
func (s *Store) readIndex(ctx context.Context, r Ref) (*index, error) {
	if r.Path == "" {
		return nil, fmt.Errorf("%s: no image name after the bucket", r)
	}
	obj, err := s.c.GetObject(ctx, r.Bucket, r.indexKey(), minio.GetObjectOptions{})
	if err != nil {
		return nil, s.storeErr("reading the index", r, r.indexKey(), err)
	}
	defer obj.Close()
	body, err := io.ReadAll(io.LimitReader(obj, maxIndex+1))
	if err != nil {
		if notFound(err) {
			return nil, fmt.Errorf("%s: no image there (no complete push wrote its index)", r)
		}
		return nil, s.storeErr("reading the index", r, r.indexKey(), err)
	}
	if len(body) > maxIndex {
		return nil, fmt.Errorf("%s: its index is larger than %d bytes", r, maxIndex)
	}
	var idx index
	if err := json.Unmarshal(body, &idx); err != nil {
		return nil, fmt.Errorf("%s: its index does not parse: %v", r, err)
	}
	if idx.Format != indexFormat {
		return nil, fmt.Errorf("%s: index format %d, this gpucr reads %d", r, idx.Format, indexFormat)
	}
	if len(idx.Files) > maxFiles {
		return nil, fmt.Errorf("%s: its index lists %d files", r, len(idx.Files))
	}
	seen := map[string]bool{}
	manifest := false
	for _, f := range idx.Files {
		if !validRel(f.Path) || seen[f.Path] || f.Size < 0 || len(f.SHA256) != 64 || strings.Trim(f.SHA256, "0123456789abcdef") != "" ||
			f.Mode&^0o777 != 0 || skipped(f.Path) {
			return nil, fmt.Errorf("%s: its index lists a file it may not (%q, %d bytes, hash %q, mode %o)", r, f.Path, f.Size, f.SHA256, f.Mode)
		}
		seen[f.Path] = true
		manifest = manifest || f.Path == manifestPath
	}
	if !manifest {
		return nil, fmt.Errorf("%s: its index lists no GPU image manifest (%s)", r, manifestPath)
	}
	return &idx, nil
}

// validRel: a clean relative path with no part that leaves the directory.
func validRel(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.Contains(p, "\x00") {
		return false
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." || part == "." || part == "" {
			return false
		}
	}
	return true
}

// ErrDamaged: a blob's bytes are not those its index names.
var ErrDamaged = errors.New("damaged in the object store")

// Pull copies the image r into dir (made 0700; it must not exist, or be
// empty), Jobs files at once, each checked against its index's size and
// SHA-256 before it takes its place; the GPU image's manifest comes last,
// so a pull that fails leaves no image (and removes what it wrote).
func (s *Store) Pull(ctx context.Context, r Ref, dir string) (st Stats, err error) {
	t0 := time.Now()
	st.Reference = r.String()
	idx, err := s.readIndex(ctx, r)
	if err != nil {
		return st, err
	}
	st.ImageID = idx.ImageID
	if err := os.Mkdir(dir, 0o700); err != nil {
		if !errors.Is(err, fs.ErrExist) {
			return st, fmt.Errorf("pull into %s: %w", dir, err)
		}
		if ents, rerr := os.ReadDir(dir); rerr != nil || len(ents) > 0 {
			return st, fmt.Errorf("pull into %s: the directory is not empty", dir)
		}
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir) // its contents, all this pull's
			_ = os.Mkdir(dir, 0o700)
		}
	}()
	var rest []indexFile
	var last indexFile
	for _, f := range idx.Files {
		if f.Path == manifestPath {
			last = f
		} else {
			rest = append(rest, f)
		}
	}
	var moved atomic.Int64
	fetch := func(ctx context.Context, f indexFile) error {
		if err := s.fetch(ctx, r, dir, f); err != nil {
			return err
		}
		moved.Add(f.Size)
		return nil
	}
	if err := s.each(ctx, len(rest), func(ctx context.Context, i int) error { return fetch(ctx, rest[i]) }); err != nil {
		return st, err
	}
	if err := fetch(ctx, last); err != nil {
		return st, err
	}
	for _, f := range idx.Files {
		st.Bytes += f.Size
	}
	st.Files, st.Moved = len(idx.Files), moved.Load()
	st.Seconds = time.Since(t0).Seconds()
	return st, nil
}

// fetch writes f's blob into dir, checked, under a temporary name first.
func (s *Store) fetch(ctx context.Context, r Ref, dir string, f indexFile) error {
	dst := filepath.Join(dir, filepath.FromSlash(f.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("pull %s: %w", f.Path, err)
	}
	key := blobKey(f.SHA256)
	obj, err := s.c.GetObject(ctx, r.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return s.storeErr("pull: reading "+f.Path+" from", r, key, err)
	}
	defer obj.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-pull-")
	if err != nil {
		return fmt.Errorf("pull %s: %w", f.Path, err)
	}
	defer os.Remove(tmp.Name()) // once renamed, nothing is there
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(obj, f.Size+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if notFound(err) {
			return fmt.Errorf("pull %s: its blob s3://%s/%s is missing from the store", f.Path, r.Bucket, key)
		}
		return s.storeErr("pull: reading "+f.Path+" from", r, key, err)
	}
	if n != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
		return fmt.Errorf("pull %s: %w: s3://%s/%s holds %d bytes that are not the %d its index names by hash", f.Path, ErrDamaged,
			r.Bucket, key, n, f.Size)
	}
	if err := os.Chmod(tmp.Name(), fs.FileMode(f.Mode)); err != nil {
		return fmt.Errorf("pull %s: %w", f.Path, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("pull %s: %w", f.Path, err)
	}
	return nil
}

// Listed is an image on a level.
type Listed struct {
	URL     string    `json:"url"`
	Written time.Time `json:"written"`
}

// List lists the images at or below r.
func (s *Store) List(ctx context.Context, r Ref) ([]Listed, error) {
	prefix := ""
	if r.Path != "" {
		prefix = r.Path + "/"
	}
	var out []Listed
	for o := range s.c.ListObjects(ctx, r.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, s.storeErr("listing", r, prefix, o.Err)
		}
		if name, ok := strings.CutSuffix(o.Key, "/"+indexName); ok && !strings.HasPrefix(o.Key, ".gpucr/") {
			out = append(out, Listed{URL: Ref{Bucket: r.Bucket, Path: name}.String(), Written: o.LastModified})
		}
	}
	return out, nil
}

// PullCached is Pull into a directory of base named by the image's id
// (made 0700), which a later pull of the same image finds: an image
// committed there with that id is used as it is (the restore checks every
// GPU chunk it reads). It returns the directory and whether it was pulled
// now.
func (s *Store) PullCached(ctx context.Context, r Ref, base string) (dir string, st Stats, pulled bool, err error) {
	idx, err := s.readIndex(ctx, r)
	if err != nil {
		return "", st, false, err
	}
	if len(idx.ImageID) == 0 || strings.Trim(idx.ImageID, "0123456789abcdef") != "" {
		return "", st, false, fmt.Errorf("%s: its index names no image id", r)
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", st, false, err
	}
	dir = filepath.Join(base, idx.ImageID)
	if im, err := image.Open(dir); err == nil {
		same := hex.EncodeToString(im.Manifest().GetImageId()) == idx.ImageID
		im.Close()
		if same {
			return dir, Stats{Reference: r.String(), ImageID: idx.ImageID}, false, nil
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", st, false, err
	}
	st, err = s.Pull(ctx, r, dir)
	return dir, st, err == nil, err
}
