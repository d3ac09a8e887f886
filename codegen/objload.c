/* objload.c — see objload.h. Every header, section and symbol is read
 * through memcpy (the bytes may sit at any alignment inside a package) and
 * bounds-checked before use. */
#include "objload.h"

#include "alloc.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct tf_obj {
    void *map;
    size_t size;
};

typedef struct {
    const unsigned char *data;
    size_t n;
    Elf64_Ehdr eh;
    Elf64_Shdr *sh;        /* e_shnum section headers */
    uintptr_t *base;       /* where each section lies in the mapping; 0: not loaded */
    char *why;
    size_t n_why;
} loader;

static tf_obj_status fail(loader *L, tf_obj_status st, const char *fmt, ...)
{
    if (L->why && L->n_why) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->why, L->n_why, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* Whether [off, off + len) lies inside the object. */
static bool in_bounds(const loader *L, uint64_t off, uint64_t len) { return off <= L->n && len <= L->n - off; }

/* The NUL-terminated string at off in string table section s, or NULL. */
static const char *str_at(const loader *L, unsigned s, uint64_t off)
{
    if (s >= L->eh.e_shnum || L->sh[s].sh_type != SHT_STRTAB) return NULL;
    const Elf64_Shdr *t = &L->sh[s];
    if (off >= t->sh_size) return NULL;
    const char *p = (const char *)L->data + t->sh_offset + off;
    return memchr(p, 0, t->sh_size - off) ? p : NULL;
}

static bool loaded(const Elf64_Shdr *s) { return (s->sh_flags & SHF_ALLOC) && s->sh_size > 0; }

/* .eh_frame is left out: nothing registers it (objload.h). */
static bool skipped(const loader *L, unsigned i)
{
    const char *name = str_at(L, L->eh.e_shstrndx, L->sh[i].sh_name);
    return L->sh[i].sh_type == SHT_X86_64_UNWIND || (name && strcmp(name, ".eh_frame") == 0);
}

static size_t align_up(size_t x, size_t a) { return a > 1 ? (x + a - 1) / a * a : x; }

/* Symbol i of symbol table section st into *sym; false when out of range. */
static bool symbol(const loader *L, const Elf64_Shdr *st, uint64_t i, Elf64_Sym *sym)
{
    if (i >= st->sh_size / sizeof(Elf64_Sym)) return false;
    memcpy(sym, L->data + st->sh_offset + i * sizeof(Elf64_Sym), sizeof *sym);
    return true;
}

/* The address of symbol i of symbol table section st. */
static tf_obj_status symbol_address(loader *L, unsigned st, uint64_t i, tf_obj_resolver resolve, void *ctx, uint64_t *addr)
{
    Elf64_Sym sym;
    if (!symbol(L, &L->sh[st], i, &sym)) return fail(L, TF_OBJ_MALFORMED, "a relocation names symbol %llu of %llu", (unsigned long long)i,
                                                     (unsigned long long)(L->sh[st].sh_size / sizeof(Elf64_Sym)));
    const char *name = str_at(L, L->sh[st].sh_link, sym.st_name);
    if (sym.st_shndx == SHN_UNDEF) {
        if (!name || !*name) return fail(L, TF_OBJ_MALFORMED, "a relocation names an undefined symbol without a name");
        if (ELF64_ST_TYPE(sym.st_info) == STT_TLS) return fail(L, TF_OBJ_UNSUPPORTED, "thread-local symbol %s", name);
        void *p = resolve ? resolve(name, ctx) : NULL;
        if (!p) p = dlsym(RTLD_DEFAULT, name);
        if (!p) return fail(L, TF_OBJ_UNDEFINED, "undefined symbol %s", name);
        *addr = (uint64_t)(uintptr_t)p;
        return TF_OBJ_OK;
    }
    if (sym.st_shndx == SHN_ABS) {
        *addr = sym.st_value;
        return TF_OBJ_OK;
    }
    if (sym.st_shndx == SHN_COMMON || sym.st_shndx >= SHN_LORESERVE)
        return fail(L, TF_OBJ_UNSUPPORTED, "symbol %s in special section %#x", name ? name : "?", (unsigned)sym.st_shndx);
    if (sym.st_shndx >= L->eh.e_shnum || !L->base[sym.st_shndx])
        return fail(L, TF_OBJ_UNSUPPORTED, "symbol %s in section %u, which is not loaded", name ? name : "?", (unsigned)sym.st_shndx);
    if (sym.st_value > L->sh[sym.st_shndx].sh_size) return fail(L, TF_OBJ_MALFORMED, "symbol %s lies past its section", name ? name : "?");
    *addr = L->base[sym.st_shndx] + sym.st_value;
    return TF_OBJ_OK;
}

/* Apply relocation section r (SHT_RELA) to the section it targets. */
static tf_obj_status relocate(loader *L, unsigned r, tf_obj_resolver resolve, void *ctx)
{
    const Elf64_Shdr *rs = &L->sh[r];
    unsigned target = rs->sh_info, st = rs->sh_link;
    if (target >= L->eh.e_shnum || st >= L->eh.e_shnum || L->sh[st].sh_type != SHT_SYMTAB)
        return fail(L, TF_OBJ_MALFORMED, "relocation section %u names section %u and symbol table %u", r, target, st);
    if (!L->base[target]) return TF_OBJ_OK;   /* relocates something not loaded (.eh_frame) */
    if (rs->sh_entsize != sizeof(Elf64_Rela)) return fail(L, TF_OBJ_MALFORMED, "relocation entries of %llu bytes", (unsigned long long)rs->sh_entsize);
    uint64_t count = rs->sh_size / sizeof(Elf64_Rela);
    uint64_t size = L->sh[target].sh_size;
    for (uint64_t k = 0; k < count; k++) {
        Elf64_Rela rel;
        memcpy(&rel, L->data + rs->sh_offset + k * sizeof rel, sizeof rel);
        unsigned type = ELF64_R_TYPE(rel.r_info);
        if (type == R_X86_64_NONE) continue;
        unsigned width = type == R_X86_64_64 || type == R_X86_64_PC64 ? 8 : 4;
        if (rel.r_offset > size || width > size - rel.r_offset)
            return fail(L, TF_OBJ_MALFORMED, "a relocation at %#llx lies past its section", (unsigned long long)rel.r_offset);
        uint64_t S;
        tf_obj_status s = symbol_address(L, st, ELF64_R_SYM(rel.r_info), resolve, ctx, &S);
        if (s) return s;
        uint64_t P = L->base[target] + rel.r_offset, A = (uint64_t)rel.r_addend;
        unsigned char *at = (unsigned char *)(uintptr_t)P;
        uint64_t v64;
        int64_t sv;
        uint32_t v32;
        switch (type) {
        case R_X86_64_64: v64 = S + A; memcpy(at, &v64, 8); break;
        case R_X86_64_PC64: v64 = S + A - P; memcpy(at, &v64, 8); break;
        case R_X86_64_PC32:
        case R_X86_64_PLT32:
            sv = (int64_t)(S + A - P);
            if (sv < INT32_MIN || sv > INT32_MAX) return fail(L, TF_OBJ_UNSUPPORTED, "a 32-bit PC-relative relocation out of reach");
            v32 = (uint32_t)(int32_t)sv;
            memcpy(at, &v32, 4);
            break;
        case R_X86_64_32:
            if (S + A > UINT32_MAX) return fail(L, TF_OBJ_UNSUPPORTED, "a 32-bit absolute relocation out of reach");
            v32 = (uint32_t)(S + A);
            memcpy(at, &v32, 4);
            break;
        case R_X86_64_32S:
            sv = (int64_t)(S + A);
            if (sv < INT32_MIN || sv > INT32_MAX) return fail(L, TF_OBJ_UNSUPPORTED, "a 32-bit absolute relocation out of reach");
            v32 = (uint32_t)(int32_t)sv;
            memcpy(at, &v32, 4);
            break;
        default: return fail(L, TF_OBJ_UNSUPPORTED, "relocation type %u", type);
        }
    }
    return TF_OBJ_OK;
}

/* The headers: an x86-64 relocatable object whose sections lie inside it. */
static tf_obj_status read_headers(loader *L)
{
    if (L->n < sizeof L->eh || memcmp(L->data, ELFMAG, SELFMAG) != 0) return fail(L, TF_OBJ_MALFORMED, "not an ELF object");
    memcpy(&L->eh, L->data, sizeof L->eh);
    const Elf64_Ehdr *e = &L->eh;
    if (e->e_ident[EI_CLASS] != ELFCLASS64 || e->e_ident[EI_DATA] != ELFDATA2LSB || e->e_type != ET_REL || e->e_machine != EM_X86_64)
        return fail(L, TF_OBJ_UNSUPPORTED, "not a 64-bit little-endian x86-64 relocatable object");
    if (e->e_shentsize != sizeof(Elf64_Shdr) || e->e_shnum == 0 || e->e_shstrndx >= e->e_shnum ||
        !in_bounds(L, e->e_shoff, (uint64_t)e->e_shnum * sizeof(Elf64_Shdr)))
        return fail(L, TF_OBJ_MALFORMED, "its section headers lie outside it");
    if (!(L->sh = tf_calloc(e->e_shnum, sizeof *L->sh)) || !(L->base = tf_calloc(e->e_shnum, sizeof *L->base)))
        return fail(L, TF_OBJ_NOMEM, "out of memory");
    memcpy(L->sh, L->data + e->e_shoff, (size_t)e->e_shnum * sizeof *L->sh);
    for (unsigned i = 1; i < e->e_shnum; i++) {
        const Elf64_Shdr *s = &L->sh[i];
        if (s->sh_type != SHT_NOBITS && !in_bounds(L, s->sh_offset, s->sh_size))
            return fail(L, TF_OBJ_MALFORMED, "section %u lies outside the object", i);
        if (s->sh_addralign > 4096 && loaded(s)) return fail(L, TF_OBJ_UNSUPPORTED, "section %u wants %llu-byte alignment", i, (unsigned long long)s->sh_addralign);
        if (s->sh_type == SHT_REL) return fail(L, TF_OBJ_UNSUPPORTED, "REL relocations (section %u)", i);
        if (s->sh_type == SHT_RELA && s->sh_entsize != sizeof(Elf64_Rela))
            return fail(L, TF_OBJ_MALFORMED, "relocation section %u has %llu-byte entries", i, (unsigned long long)s->sh_entsize);
        if (s->sh_type == SHT_SYMTAB && s->sh_entsize != sizeof(Elf64_Sym))
            return fail(L, TF_OBJ_MALFORMED, "symbol table %u has %llu-byte entries", i, (unsigned long long)s->sh_entsize);
        if (loaded(s) && (s->sh_flags & SHF_TLS)) return fail(L, TF_OBJ_UNSUPPORTED, "thread-local section %u", i);
    }
    return TF_OBJ_OK;
}

tf_obj_status tf_obj_load(const void *data, size_t n, const char *sym, tf_obj_resolver resolve, void *ctx, tf_obj **out, void **addr,
                          char *why, size_t n_why)
{
    *out = NULL;
    *addr = NULL;
    if (why && n_why) why[0] = 0;
    loader L = {.data = data, .n = n, .why = why, .n_why = n_why};
    tf_obj_status st = read_headers(&L);
    tf_obj *o = NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* the layout: code first, then (from a page boundary) everything else */
    size_t code_end = 0, end = 0;
    for (int pass = 0; pass < 2 && !st; pass++) {
        size_t at = pass ? align_up(code_end, page) : 0;
        for (unsigned i = 1; i < L.eh.e_shnum; i++) {
            const Elf64_Shdr *s = &L.sh[i];
            if (!loaded(s) || skipped(&L, i) || ((s->sh_flags & SHF_EXECINSTR) != 0) != (pass == 0)) continue;
            at = align_up(at, (size_t)(s->sh_addralign ? s->sh_addralign : 1));
            L.base[i] = at + 1;   /* an offset for now, +1 so that 0 stays "not loaded" */
            at += (size_t)s->sh_size;
        }
        if (pass) end = at;
        else code_end = at;
    }
    if (!st && code_end == 0) st = fail(&L, TF_OBJ_MALFORMED, "no code");
    size_t size = align_up(end, page);
    void *map = MAP_FAILED;
    if (!st && (map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED)
        st = fail(&L, TF_OBJ_NOMEM, "cannot map %zu bytes", size);
    bool writable = false;
    if (!st) {
        for (unsigned i = 1; i < L.eh.e_shnum; i++) {
            if (!L.base[i]) continue;
            L.base[i] = (uintptr_t)map + L.base[i] - 1;
            if (L.sh[i].sh_type != SHT_NOBITS) memcpy((void *)L.base[i], L.data + L.sh[i].sh_offset, (size_t)L.sh[i].sh_size);
            if (L.sh[i].sh_flags & SHF_WRITE) writable = true;
        }
        for (unsigned i = 1; i < L.eh.e_shnum && !st; i++)
            if (L.sh[i].sh_type == SHT_RELA) st = relocate(&L, i, resolve, ctx);
    }
    /* the function named sym */
    for (unsigned i = 1; i < L.eh.e_shnum && !st && !*addr; i++) {
        if (L.sh[i].sh_type != SHT_SYMTAB) continue;
        for (uint64_t k = 1; k < L.sh[i].sh_size / sizeof(Elf64_Sym); k++) {
            Elf64_Sym s;
            symbol(&L, &L.sh[i], k, &s);
            const char *name = str_at(&L, L.sh[i].sh_link, s.st_name);
            if (!name || strcmp(name, sym) != 0 || ELF64_ST_TYPE(s.st_info) != STT_FUNC || s.st_shndx == SHN_UNDEF) continue;
            uint64_t a;
            if ((st = symbol_address(&L, i, k, NULL, NULL, &a))) break;
            if (!(L.sh[s.st_shndx].sh_flags & SHF_EXECINSTR)) st = fail(&L, TF_OBJ_MALFORMED, "%s is not in a code section", sym);
            *addr = (void *)(uintptr_t)a;
            break;
        }
    }
    if (!st && !*addr) st = fail(&L, TF_OBJ_MALFORMED, "no function %s", sym);
    size_t code_pages = align_up(code_end, page);
    if (!st && (mprotect(map, code_pages, PROT_READ | PROT_EXEC) != 0 ||
                (size > code_pages && mprotect((char *)map + code_pages, size - code_pages, writable ? PROT_READ | PROT_WRITE : PROT_READ) != 0)))
        st = fail(&L, TF_OBJ_NOMEM, "cannot protect the loaded code");
    if (!st && !(o = tf_malloc(sizeof *o))) st = fail(&L, TF_OBJ_NOMEM, "out of memory");
    if (st) {
        if (map != MAP_FAILED) munmap(map, size);
        *addr = NULL;
    } else {
        o->map = map;
        o->size = size;
        *out = o;
    }
    tf_free(L.sh);
    tf_free(L.base);
    return st;
}

void tf_obj_free(tf_obj *o)
{
    if (!o) return;
    munmap(o->map, o->size);
    tf_free(o);
}
