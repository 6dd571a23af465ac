/* OVERLORD's launcher: PREFIX/bin/overlord, the AppArmor attachment point.
 *
 * It must not be a way to run code of anyone's choosing under the profile. So before it runs
 * anything it checks that nothing it will load can be changed by anyone but root, it drops the
 * environment variables that make the loader, iconv or OpenSSL load code, and it runs a fixed
 * interpreter, fixed at build time, in isolated mode on a fixed entry point:
 *
 *     OVERLORD_PYTHON -I -S OVERLORD_LIBDIR/main.py argv[1..]
 *
 * -I: no PYTHON* variable (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, ...), no user site, neither
 * the script's directory nor the current one on sys.path; -S: no site module, so no .pth file
 * of any site-packages runs (the engine is stdlib-only).
 *
 * Built by packaging/install.sh (and the tests) with exactly:
 *   cc -std=c99 -O2 -Wall -Wextra -Werror [-static] \
 *      -DOVERLORD_PYTHON='"/usr/bin/python3.11"' -DOVERLORD_LIBDIR='"/usr/local/lib/overlord"' \
 *      -o OUT packaging/launcher.c
 * -static where libc.a exists: a dynamically linked launcher would itself run an LD_PRELOAD
 * library before main(); static, no loader runs in this process at all.
 *
 * Exit 126: refused (one line naming the path and why); 127: the interpreter would not start.
 */
#define _GNU_SOURCE          /* O_CLOEXEC, O_DIRECTORY, O_NOFOLLOW, openat, fdopendir (POSIX.1-2008) */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef OVERLORD_PYTHON
#error "build with -DOVERLORD_PYTHON='\"/abs/path/of/python3.X\"' (the interpreter's real path)"
#endif
#ifndef OVERLORD_LIBDIR
#error "build with -DOVERLORD_LIBDIR='\"/abs/path/lib/overlord\"' (the installed engine)"
#endif

/* Both must be absolute: a relative path would be looked up from whatever directory the caller
 * runs us in. Pasting them beside another literal fails the build for anything that is not a
 * string literal. C99 cannot index a string literal in a constant expression, so the build-time
 * check of the leading '/' is GCC's (and clang's) error attribute on a call that -O folds away
 * when the path is absolute; main() checks it again at run time for any other compiler. */
#if defined(__GNUC__) && defined(__OPTIMIZE__) && defined(__has_attribute)
#if __has_attribute(error)
#define CHECK_ABSOLUTE_AT_BUILD 1
extern void overlord_python_is_not_absolute(void)
    __attribute__((error("OVERLORD_PYTHON must be an absolute path")));
extern void overlord_libdir_is_not_absolute(void)
    __attribute__((error("OVERLORD_LIBDIR must be an absolute path")));
#endif
#endif

#define REINSTALL " (reinstall with packaging/install.sh)"

extern char **environ;

/* One line on stderr, written with a single write(2) so it is never interleaved; a control
 * character in a file name is shown as '?', so the line stays one line. */
static void say(const char *fmt, const char *a, const char *b)
{
    char line[PATH_MAX + 256];
    int n = snprintf(line, sizeof line, fmt, a, b);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line)
        n = sizeof line - 1;
    for (int i = 0; i < n - 1; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
            line[i] = '?';
    if (write(2, line, (size_t)n) < 0) {
        /* nothing more to say anywhere */
    }
}

static void refuse(const char *path, const char *reason)
{
    say("overlord: refusing to start: %s %s" REINSTALL "\n", path, reason);
    exit(126);
}

static const char *kind(mode_t m)
{
    if (S_ISLNK(m)) return "is a symlink";
    if (S_ISFIFO(m)) return "is a fifo";
    if (S_ISSOCK(m)) return "is a socket";
    if (S_ISCHR(m) || S_ISBLK(m)) return "is a device";
    if (S_ISDIR(m)) return "is a directory";
    return "is not a regular file";
}

/* Only root may be able to change it: owned by root (a file's owner can chmod it, and can
 * replace its content), and writable by neither group nor others. For a directory "change"
 * includes adding, removing or renaming entries, which is what would swap a file for another. */
static void check_owner_mode(const char *path, const struct stat *st)
{
    char reason[64];
    if (st->st_uid != 0) {
        snprintf(reason, sizeof reason, "is not owned by root (uid %lu)", (unsigned long)st->st_uid);
        refuse(path, reason);
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(reason, sizeof reason, "is %s-writable (mode %04o)",
                 (st->st_mode & S_IWOTH) ? "world" : "group", (unsigned)(st->st_mode & 07777));
        refuse(path, reason);
    }
}

static void refuse_errno(const char *path, int err)
{
    char reason[128];
    if (err == ENOENT)
        refuse(path, "does not exist");
    snprintf(reason, sizeof reason, "cannot be checked: %s", strerror(err));
    refuse(path, reason);
}

/* Open `name` in the directory `dirfd` as a directory, never following a symlink, and check it.
 * `path` (the full path, for messages) names the same thing. Returns the new fd: each step opens
 * relative to the previous fd, not by a path string, so a rename of some directory above cannot
 * make the walk check one thing and then descend into another. */
static int open_dir_checked(int dirfd, const char *name, const char *path)
{
    struct stat st;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        /* say what it is rather than ELOOP/ENOTDIR */
        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
            refuse(path, kind(st.st_mode));
        refuse_errno(path, err);
    }
    if (fstat(fd, &st) != 0)
        refuse_errno(path, errno);
    check_owner_mode(path, &st);
    return fd;
}

/* Walk the absolute path `path` from / down, checking every directory on the way (and, when
 * `last_is_file`, the final component as a regular file instead). Returns an fd of the last
 * directory (or -1 for a file, which is closed after its check). */
static int check_path(const char *path, int last_is_file)
{
    char buf[PATH_MAX], sofar[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf)
        refuse(path, "is too long");
    memcpy(buf, path, len + 1);

    int fd = open_dir_checked(AT_FDCWD, "/", "/");
    size_t at = 0;                       /* length of `sofar` */
    char *p = buf;
    sofar[0] = '\0';
    for (;;) {
        while (*p == '/')
            p++;
        if (*p == '\0')
            return fd;
        char *name = p;
        while (*p && *p != '/')
            p++;
        int last = 1;
        if (*p) {
            *p++ = '\0';
            for (char *q = p; *q; q++)
                if (*q != '/') { last = 0; break; }
        }
        /* a ".." would climb out of what was checked */
        if (strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
            refuse(path, "is not a normalised path");
        at += (size_t)snprintf(sofar + at, sizeof sofar - at, "/%s", name);

        if (last && last_is_file) {
            /* Looked at, never opened (opening a device or fifo can have effects). Its
             * directory is root's and no one else's to change, so what fstatat sees here is
             * what execve will run. */
            struct stat st;
            if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
                refuse_errno(sofar, errno);
            if (!S_ISREG(st.st_mode))
                refuse(sofar, kind(st.st_mode));
            check_owner_mode(sofar, &st);
            close(fd);
            return -1;
        }
        int next = open_dir_checked(fd, name, sofar);
        close(fd);
        fd = next;
    }
}

/* Every entry under the directory `fd` (whose path is path[0..len)): a regular file or a
 * directory, never a symlink, fifo, socket or device (a symlink could point anywhere; a fifo
 * could block or feed the import system whatever its writer likes), and owned and writable by
 * root only. Entries are examined with fstatat(AT_SYMLINK_NOFOLLOW) and subdirectories entered
 * with openat(O_NOFOLLOW | O_DIRECTORY) on the parent's fd, and the entered directory is the
 * very inode that was checked (same st_dev/st_ino), so nothing can be swapped mid-walk.
 * Takes ownership of fd. */
static void walk(int fd, char *path, size_t len)
{
    DIR *d = fdopendir(fd);
    if (!d)
        refuse_errno(path, errno);
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno)
                refuse_errno(path, errno);
            break;
        }
        const char *name = e->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
            continue;
        size_t nlen = strlen(name);
        if (len + 1 + nlen >= PATH_MAX)
            refuse(path, "holds a path that is too long");
        path[len] = '/';
        memcpy(path + len + 1, name, nlen + 1);

        struct stat st;
        if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            refuse_errno(path, errno);
        if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
            refuse(path, kind(st.st_mode));
        check_owner_mode(path, &st);
        if (S_ISDIR(st.st_mode)) {
            struct stat st2;
            int sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0)
                refuse_errno(path, errno);
            if (fstat(sub, &st2) != 0)
                refuse_errno(path, errno);
            if (st2.st_dev != st.st_dev || st2.st_ino != st.st_ino)
                refuse(path, "changed while it was being checked");
            walk(sub, path, len + 1 + nlen);
        }
        path[len] = '\0';
    }
    closedir(d);
}

/* The variables that make a library load code of the caller's choosing into the interpreter:
 * LD_* (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...: the dynamic loader), GCONV_PATH (iconv's
 * modules), and OpenSSL's configuration and module paths (a configuration names provider and
 * engine libraries to load; OpenSSL reads it on first use, and `import hashlib` is enough).
 * Everything else passes through: the engine reads OVERLORD_*, HOME, PATH, and the commands it
 * runs get the caller's environment. */
static int loads_code(const char *e)
{
    static const char *const exact[] = {
        "GCONV_PATH", "OPENSSL_CONF", "OPENSSL_CONF_INCLUDE", "OPENSSL_MODULES", "OPENSSL_ENGINES",
    };
    size_t n = strcspn(e, "=");
    if (strncmp(e, "LD_", 3) == 0)
        return 1;
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (strlen(exact[i]) == n && strncmp(e, exact[i], n) == 0)
            return 1;
    return 0;
}

/* Drop them from environ, in place (every occurrence: a duplicated name could otherwise
 * survive as a second entry). */
static void scrub_environment(void)
{
    char **in = environ, **out = environ;
    if (!in)
        return;
    for (; *in; in++)
        if (!loads_code(*in))
            *out++ = *in;
    *out = NULL;
}

int main(int argc, char **argv)
{
    static const char python[] = OVERLORD_PYTHON;
    static const char libdir[] = OVERLORD_LIBDIR;
    static const char entry[] = OVERLORD_LIBDIR "/main.py";

#ifdef CHECK_ABSOLUTE_AT_BUILD
    if ((OVERLORD_PYTHON)[0] != '/')
        overlord_python_is_not_absolute();
    if ((OVERLORD_LIBDIR)[0] != '/')
        overlord_libdir_is_not_absolute();
#endif
    if (python[0] != '/')
        refuse(python, "is not an absolute path");
    if (libdir[0] != '/')
        refuse(libdir, "is not an absolute path");

    /* 1. The interpreter, and every directory above it: owned by root, not writable by others. */
    check_path(python, 1);

    /* 2. Every directory from / down to LIBDIR, then all of LIBDIR. main.py must be there (a
     *    regular file, checked by the walk like everything else). */
    int fd = check_path(libdir, 0);
    struct stat st;
    if (fstatat(fd, "main.py", &st, AT_SYMLINK_NOFOLLOW) != 0)
        refuse_errno(entry, errno);
    if (!S_ISREG(st.st_mode))
        refuse(entry, kind(st.st_mode));
    char path[PATH_MAX];
    size_t len = strlen(libdir);
    while (len > 1 && libdir[len - 1] == '/')
        len--;
    memcpy(path, libdir, len);
    path[len] = '\0';
    walk(fd, path, len);

    /* 3. No loader, iconv or OpenSSL module variable reaches the interpreter. */
    scrub_environment();

    /* 4. The fixed interpreter; argv[0] is its absolute path, from which CPython derives
     *    sys.executable. The caller's arguments follow the entry point verbatim. */
    int extra = argc > 1 ? argc - 1 : 0;
    char **args = calloc((size_t)extra + 5, sizeof *args);
    if (!args) {
        say("overlord: cannot start %s: %s\n", python, strerror(ENOMEM));
        return 127;
    }
    args[0] = (char *)python;
    args[1] = "-I";
    args[2] = "-S";
    args[3] = (char *)entry;
    for (int i = 0; i < extra; i++)
        args[4 + i] = argv[1 + i];
    args[4 + extra] = NULL;
    execve(python, args, environ);
    say("overlord: cannot start %s: %s\n", python, strerror(errno));
    return 127;
}
